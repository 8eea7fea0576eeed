"""Options of the loss stage: the language-model head and its cross-entropy computed in chunks of tokens.

After the chain's last block, a causal LM's head computes logits (tokens x vocabulary) and the loss their
log-softmax; plain autograd keeps both until the backward, which makes them the loss stage's a-bar. With
option ``chunks=k`` (:mod:`planner.executor.chunked_loss` at run time) the head and the loss run over ``1/k``
of the tokens at a time and keep neither; the backward recomputes each chunk's logits. In the cost model
(:class:`~planner.model.stage_option.StageOption`, rules in :mod:`planner.simulation.memory_rules`):

* a-bar_k = a-bar - the logits' part of it, ``factor x logits``: ``factor`` is 2 when the logits are
  float32 (logits and log-softmax), 3 when they are half precision (their float32 copy's log-softmax is
  twice their size); it is read from the measured a-bar (``round(a-bar / logits)``, clamped to 1..3);
* o_f and o_b with the option: ``factor x logits / k`` (one chunk's logits and log-softmax, or softmax in
  the backward) above the stage's own measured forward overhead;
* the backward recomputes the head's forward once (its time and FLOPs as recorded) plus a fixed cost per
  chunk (:data:`CHUNK_OVERHEAD_MS`): more chunks hold less and take a little longer, which is what the DP
  weighs.

Each chunk count also comes ``eager`` (the gradients computed in the loss's forward, as Liger Kernel's fused
linear cross-entropy does): no logits recomputed, only the per-chunk cost, but a-bar_k then holds the
gradients of the hidden states and of the head's parameters from the loss's forward to its backward, where
they would be allocated anyway (the memory rule hands them over); where the parameters' gradients already
exist, the runtime adds the head's into them and holds only the hidden states and their gradient
(``param_grad_bytes``, :func:`without_weight_grads`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from planner.errors import ChainError
from planner.model.chain import Chain, Stage
from planner.model.stage_option import StageOption

DEFAULT_CHUNKS = (4, 16, 64)
"""Chunk counts offered by default (each recomputing and eager): a quarter of the logits at a time to 1/64."""

CHUNK_OVERHEAD_MS = 0.05
"""What each chunk adds to the step (two small kernels' launches and Python between them), per chunk."""

HEAD_KINDS = frozenset({"Linear"})
"""Module classes recognised as a language-model head."""

CAUSAL_LM_CLASSES = ("ForCausalLM", "LMHeadModel")
"""How Hugging Face names its causal LMs' classes (``LlamaForCausalLM``, ``GPT2LMHeadModel``): the models whose
``loss_function`` the executor can replace (:mod:`planner.executor.chunked_head`)."""


@dataclass(frozen=True)
class LossHead:
    """The language-model head the loss stage runs, as a planning pass recorded it.

    Attributes:
        module: its qualified name (``"lm_head"``).
        logits_bytes: its output, the logits.
        forward_ms: its forward time.
        flops: its forward's FLOPs (0 when the run recorded no ops).
        weight_bytes: its parameters' bytes: an eager option allocates their gradient in the loss's forward,
            whether or not the step's own gradients already exist.
    """

    module: str
    logits_bytes: int
    forward_ms: float
    flops: int = 0
    weight_bytes: int = 0

    def __post_init__(self) -> None:
        if self.logits_bytes <= 0:
            raise ChainError(f"head {self.module!r}: logits_bytes must be > 0, found {self.logits_bytes}")
        if self.forward_ms < 0 or self.flops < 0 or self.weight_bytes < 0:
            raise ChainError(f"head {self.module!r}: forward_ms, flops and weight_bytes must be >= 0")


def find_head(modules: Iterable[tuple[str, int, str]], chain_modules: Sequence[str]) -> str | None:
    """The language-model head among ``modules`` (``(name, forward order, class name)``): the last
    :data:`HEAD_KINDS` module that runs after the chain and lies outside its stages, or ``None``."""
    inside = tuple(chain_modules)
    last = max((order for name, order, _ in modules if name in inside), default=None)
    if last is None:
        return None
    after = [(order, name) for name, order, kind in modules
             if kind in HEAD_KINDS and order > last and not any(name == m or name.startswith(m + ".") for m in inside)]
    return max(after)[1] if after else None


def logits_factor(stage: Stage, logits_bytes: int) -> int:
    """How many logits' worth the loss stage keeps: 2 for float32 logits, 3 for half-precision ones."""
    return min(max(round(stage.saved_bytes / logits_bytes), 1), 3)


def chunk_options(stage: Stage, head: LossHead, chunks: Sequence[int] = DEFAULT_CHUNKS,
                  chunk_overhead_ms: float = CHUNK_OVERHEAD_MS, results_bytes: int = 0,
                  param_grad_bytes: int = 0) -> tuple[StageOption, ...]:
    """The loss stage's options: per chunk count, recomputing, then eager where it keeps less than the stage.

    Args:
        stage: the loss stage as profiled.
        head: its language-model head.
        chunks: the chunk counts.
        chunk_overhead_ms: what each chunk adds.
        results_bytes: what an eager option keeps besides: delta^L and the head's parameter gradients.
        param_grad_bytes: of ``results_bytes``, the parameter gradients the runtime adds into existing ``.grad``
            (float32 logits only: under autocast it holds them; :mod:`planner.executor.grad_into`).

    Raises:
        ChainError: a chunk count is not a whole number >= 2.
    """
    factor = logits_factor(stage, head.logits_bytes)
    removed = min(stage.saved_bytes - stage.output_bytes, factor * head.logits_bytes)
    if removed <= 0:
        return ()
    out = []
    for k in sorted(set(chunks)):
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ChainError(f"loss chunk counts must be whole numbers >= 2, found {k!r}")
        chunk_bytes = -(-factor * head.logits_bytes // k)
        out.append(StageOption(
            name=f"chunks={k}", saved_bytes=stage.saved_bytes - removed,
            recompute_ms=head.forward_ms + k * chunk_overhead_ms, recompute_flops=head.flops, chunks=k,
            forward_overhead_bytes=stage.forward_overhead_bytes + chunk_bytes,
            backward_overhead_bytes=stage.forward_overhead_bytes + chunk_bytes))
        if results_bytes < removed:  # an option keeps at most what the stage keeps (a Stage's rule)
            out.append(StageOption(
                name=f"chunks={k} eager", saved_bytes=stage.saved_bytes - removed + results_bytes,
                recompute_ms=k * chunk_overhead_ms, chunks=k, eager=True, param_grad_bytes=param_grad_bytes,
                forward_overhead_bytes=stage.forward_overhead_bytes + chunk_bytes, backward_overhead_bytes=0))
    return tuple(out)


def with_loss_options(chain: Chain, head: LossHead, chunks: Sequence[int] = DEFAULT_CHUNKS,
                      chunk_overhead_ms: float = CHUNK_OVERHEAD_MS) -> Chain:
    """``chain`` whose loss stage offers :func:`chunk_options` (its other options replaced)."""
    loss = chain.stages[-1]
    # an eager option allocates the head's parameter gradients itself; B hands over those the step counts
    grads = max(loss.weight_grad_bytes, head.weight_bytes)
    # float32 logits (no autocast): the runtime adds into existing .grad, keeping the head's input (delta^L's size)
    # to correct them where the backward asks for it (a scaled loss, autograd.grad)
    direct = max(grads - chain.delta(chain.length), 0) if logits_factor(loss, head.logits_bytes) == 2 else 0
    options = chunk_options(loss, head, chunks, chunk_overhead_ms, chain.delta(chain.length) + grads, direct)
    return replace(chain, stages=(*chain.stages[:-1], replace(loss, options=options)))


def without_loss_options(chain: Chain) -> Chain:
    """``chain`` whose loss stage offers no chunked option: every schedule then runs the loss as written (a chain
    file planned with ``memprof plan --no-loss-options``; a run's chain gets none with ``loss_chunks=()``)."""
    loss = chain.stages[-1]
    kept = tuple(option for option in loss.options if not option.chunks)
    return chain if kept == loss.options else replace(chain, stages=(*chain.stages[:-1], replace(loss, options=kept)))


def without_weight_grads(chain: Chain) -> Chain:
    """``chain`` with no stage allocating parameter gradients: budgets on the activations alone, as when the
    gradients already exist. An eager loss option then adds its head's gradients into them as it computes
    them and holds only delta^L and the head's input (its ``param_grad_bytes`` go); where it cannot
    (autocast), it holds its own and adds them in ``B``, which then frees them: the rule hands over only what
    the stage counts. Each stage's
    o_b is its ``existing_grads_overhead_bytes`` where the trace measured it (no gradient stays allocated,
    ``AccumulateGrad`` adds each into ``.grad`` and frees it, no embedding makes a whole-weight gradient)."""
    stages = tuple(replace(stage, weight_grad_bytes=0, options=tuple(_into_grads(o) for o in stage.options),
                           backward_overhead_bytes=_with_grads(stage), existing_grads_overhead_bytes=None)
                   for stage in chain.stages)
    return replace(chain, stages=stages)


def _with_grads(stage: Stage) -> int:
    """o_b where the parameters' ``.grad`` exist (see :func:`without_weight_grads`)."""
    existing = stage.existing_grads_overhead_bytes
    return stage.backward_overhead_bytes if existing is None else existing


def _into_grads(option: StageOption) -> StageOption:
    """``option`` as it runs where the parameters' gradients exist (an eager option adds into them)."""
    if not option.param_grad_bytes:
        return option
    return replace(option, saved_bytes=option.saved_bytes - option.param_grad_bytes, param_grad_bytes=0)


def head_from_costs(structure: Iterable[tuple[str, int, str]], chain: Chain, output_bytes: Mapping[str, int],
                    forward_ms: Mapping[str, float], flops: Mapping[str, int],
                    weight_bytes: Mapping[str, int]) -> LossHead | None:
    """The chain's :class:`LossHead` from a trace's per-module costs, or ``None`` when it has none."""
    name = find_head(list(structure), [m for stage in chain.stages[:-1] for m in stage.modules])
    if name is None or output_bytes.get(name, 0) <= 0:
        return None
    return LossHead(name, int(output_bytes[name]), float(forward_ms.get(name, 0.0)), int(flops.get(name, 0)),
                    int(weight_bytes.get(name, 0)))
