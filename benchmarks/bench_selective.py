"""Selective recomputation against torch.compile's min-cut partitioner and block-level rotor, on causal LMs (CPU).

One run, side by side, on a Hugging Face model built from its config with random weights: ``--model gpt2``
(GPT-2 small by default: 12 layers, 768 wide, 12 heads, 124M parameters; batch 2 x 256 tokens, fp32,
dropout as configured) or ``--model llama`` (the large-vocabulary case: a Llama-style model with a 128,256-token
vocabulary and 4 layers of 128, batch 1 x 512 tokens, sized for a 2-core machine with 24 GiB), every method
measured the same way on the same model and batch:

- *activations held*: what the forward leaves allocated for the backward, read from the CPU allocator
  (torch.profiler's ``[memory]`` events summed over the forward, the loss included); it counts the saved
  tensors of plain autograd, of ``torch.utils.checkpoint`` (inputs, cached outputs of selective policies), of
  compiled graphs and of the chunked loss alike, where ``saved_tensors_hooks`` miss what a checkpoint holds;
- *saved (hooks)*: the issue's measure, for the methods that keep no checkpoint (plain autograd,
  torch.compile): the distinct storages a ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees
  during the forward, parameters left out (they are the model's, not activations); a check that
  *activations held* measures the same thing where both apply;
- *fwd+bwd peak*: the highest the allocator's total rises above the step's start during forward and
  backward (parameter gradients already allocated by a warm-up step), what the planner's budgets bound;
- *step peak*: that plus the parameters and their gradients (no optimizer): the whole step's peak;
- *FLOPs*: forward + backward, ``torch.utils.flop_counter.FlopCounterMode`` around the eager step; for
  torch.compile, the same counter run inside the compiled forward and backward graphs (the partitioner's
  recomputation is in the backward graph), since a counter outside a compiled call does not see them;
- *step time*: median forward + backward wall time over ``--repeats`` steps (the first excluded); ``--repeats 0``
  skips the timing (on a loaded machine the bytes and FLOPs are exact and the times are not worth their steps).

Methods: plain autograd (store all); eager ``torch.utils.checkpoint`` of every block and of every other block;
torch.compile
(``aot_autograd`` with inductor's decompositions and the min-cut partitioner, eager kernels, i.e. the
``aot_eager_decomp_partition`` backend with FLOP counting) at ``activation_memory_budget`` 1.0, 0.5, 0.3,
0.1 and 0.0 (``--compile-budgets``; 0.0 shows what the partitioner keeps at any cost); memprof ``rotor``
(blocks kept or recomputed whole) and ``selective`` (each kept block picks a recomputation option from the
op records; options weighed by the ops' recorded times, and by their FLOPs as the min-cut partitioner
weighs them) at ``--budgets`` whole-step budgets from the lowest feasible to
store-all's, planned from one profiled step with op records (``MemoryProfiler(..., ops=True)``). The budgets
count the chain's activations alone (:func:`activations_chain`). memprof ``held`` (``solve_held``, options
weighed by time and by FLOPs) bounds what the forward holds instead of the peak, at ``--held-fractions`` of
what the blocks and the loss hold keeping everything. ``selective`` and ``held`` also choose the loss stage's
options (the LM head and its cross-entropy in 4, 16 or 64 chunks, recomputed or with the gradients computed
in the forward: :mod:`planner.discovery.loss_options`); rotor keeps the loss as written.

Run ``python -m benchmarks.bench_selective [--model gpt2|llama] [--layers 12 --width 768 --heads 12] [--repeats 3]
[--budgets 8] [--compile-budgets 1.0,0.5,0.3,0.1,0.0] [--held-fractions 0.5,0.3,0.2,0.15,0.12,0.1,0.08]
[--methods checkpoint,compile,rotor,selective,held]`` (``--quick``: a 4-layer, 256-wide model for a smoke run;
``--methods``: which methods beside plain autograd, the baseline of every ratio, are measured).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from memprof.units import format_bytes
from planner.measure.compile_baseline import COMPILE_BUDGETS, CountingBackend, memory_events, running_peak
from planner.model.chain import Chain
from planner.model.schedule import Schedule

HELD_FRACTIONS = (0.5, 0.3, 0.2, 0.15, 0.12, 0.1, 0.08)
METHODS = ("checkpoint", "compile", "rotor", "selective", "held")
"""What ``--methods`` may name, beside plain autograd (always measured: every ratio is to it)."""


@dataclass(frozen=True)
class Point:
    """One method at one setting, measured."""

    method: str
    setting: str
    held_bytes: int
    peak_bytes: int
    flops: int
    step_ms: float
    note: str = ""
    hooks_bytes: int | None = None


@dataclass(frozen=True)
class Workload:
    """The model, its repeated blocks and its batch: ``forward()`` runs the forward and returns the loss."""

    model: nn.Module
    ids: torch.Tensor
    blocks: nn.ModuleList
    name: str = "GPT-2"

    def forward(self, model: Callable[..., Any] | None = None) -> torch.Tensor:
        return (self.model if model is None else model)(input_ids=self.ids, labels=self.ids).loss


def build(layers: int, width: int, heads: int, batch: int, seq: int, vocab: int) -> Workload:
    """GPT-2 from its config, random weights (seeded), in training mode."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    # no key/value cache: a recomputed block would extend it a second time (the executor refuses one)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=max(seq, 64),
                        use_cache=False)
    model = GPT2LMHeadModel(config).train()
    return Workload(model, torch.randint(0, vocab, (batch, seq)), model.transformer.h)


def build_llama(layers: int, width: int, heads: int, batch: int, seq: int, vocab: int) -> Workload:
    """A Llama-style model from its config (untied head, grouped-query attention), random weights, training."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width * 8 // 3, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                         max_position_embeddings=max(seq, 64), use_cache=False)
    model = LlamaForCausalLM(config).train()
    return Workload(model, torch.randint(0, vocab, (batch, seq)), model.model.layers, "Llama")


def held_and_peak_bytes(forward: Callable[[], torch.Tensor]) -> tuple[int, int]:
    """Bytes the forward leaves allocated, the loss included, and the highest allocation above the step's
    start during forward + backward (the CPU allocator's events summed in time order)."""
    loss, forward_events = memory_events(forward)
    forward_peak, held = running_peak(forward_events)
    _, backward_events = memory_events(loss.backward)
    del loss
    backward_peak, _ = running_peak(backward_events, held)
    return held, max(forward_peak, backward_peak)


def hooks_saved_bytes(forward: Callable[[], torch.Tensor], model: nn.Module, after: nn.Module | None = None) -> int:
    """Bytes of the distinct non-parameter storages autograd saves during the forward, as a
    ``saved_tensors_hooks`` pack hook sees them (checkpoints' own hooks hide what they keep from it); with
    ``after``, only those first saved once ``after``'s forward has returned."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    counting = [after is None]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if counting[0] and storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    handle = after.register_forward_hook(lambda *_: counting.__setitem__(0, True)) if after is not None else None
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = forward()
    finally:
        if handle is not None:
            handle.remove()
    loss.backward()
    return sum(seen.values())


def eager_flops(forward: Callable[[], torch.Tensor]) -> int:
    """Forward + backward FLOPs of an eager step (recomputation in the backward included)."""
    with FlopCounterMode(display=False) as counter:
        forward().backward()
    return counter.get_total_flops()


def step_ms(forward: Callable[[], torch.Tensor], repeats: int) -> float:
    """Median forward + backward wall time over ``repeats`` steps, after one warm-up step (NaN for 0 repeats)."""
    if repeats == 0:
        return math.nan
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        forward().backward()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])


def measure(method: str, setting: str, forward: Callable[[], torch.Tensor], repeats: int,
            flops: Callable[[], int] | None = None, note: str = "", hooks_of: nn.Module | None = None) -> Point:
    """One point: activations held, FLOPs and step time of ``forward`` (+ its backward); with ``hooks_of``
    (the model, for a method without checkpoints) also the saved bytes a pack hook sees."""
    forward().backward()  # warm-up: lazy initialisation and compilation stay out of every number
    held, peak = held_and_peak_bytes(forward)
    hooks = hooks_saved_bytes(forward, hooks_of) if hooks_of is not None else None
    counted = flops() if flops is not None else eager_flops(forward)
    ms = step_ms(forward, repeats)
    seen = f"  hooks {format_bytes(hooks):>11}" if hooks is not None else ""
    print(f"  {method:<22} {setting:<24} held {format_bytes(held):>11}{seen}  peak {format_bytes(peak):>11}  "
          f"{counted / 1e9:8.2f} GFLOP  {ms:8.0f} ms", flush=True)
    return Point(method, setting, held, peak, counted, ms, note, hooks)


def state_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages of the parameters and their gradients."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@contextmanager
def blocks_checkpointed(blocks: nn.ModuleList, every: int = 2) -> Iterator[None]:
    """Wraps blocks 0, every, 2 x every ... in non-reentrant ``torch.utils.checkpoint`` (restored on exit)."""
    from torch.utils.checkpoint import checkpoint

    patched = list(blocks)[::every]
    for block in patched:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    try:
        yield
    finally:
        for block in patched:
            del block.forward  # the instance attribute goes; the class's forward is back


def _step(forward: Callable[[], torch.Tensor]) -> None:
    """Forward and backward: the compiled backward graph (with the partitioner's recomputation) runs here."""
    forward().backward()


def compiled_points(work: Workload, repeats: int, budgets: tuple[float, ...]) -> list[Point]:
    """torch.compile with the min-cut partitioner at each ``activation_memory_budget``."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    points = []
    for budget in budgets:
        torch._dynamo.reset()
        counter = CountingBackend()
        compiled = torch.compile(work.model, backend=counter.backend())
        with functorch_config.patch(activation_memory_budget=budget):
            forward = functools.partial(work.forward, compiled)
            points.append(measure("torch.compile", f"activation_memory_budget={budget}", forward, repeats,
                                  flops=functools.partial(counter.count, functools.partial(_step, forward)),
                                  hooks_of=work.model))
    torch._dynamo.reset()
    return points


def activations_chain(chain: Chain) -> Chain:
    """The chain whose budgets count its activations alone: no step costs, no parameter gradients.

    GPT-2's whole-step peak is its weights, their gradients and the LM head's logits, and even the chain's
    own peak (the ROTOR paper's M) comes at the end of the backward, when every parameter gradient is
    allocated and every activation freed: under either budget the blocks' activations are left free, and
    the DPs keep most of them. Budgets on the activations alone trade exactly what this table measures.
    """
    from planner.discovery.loss_options import without_weight_grads

    return without_weight_grads(chain.activations_only())


def profiled_chains(work: Workload, out: Path) -> dict[str, Chain]:
    """The chain of one profiled step with op records, its options weighed by time and by FLOPs."""
    from memprof import MemoryProfiler, load_trace
    from planner import chain_from_trace

    with MemoryProfiler(work.model, None, out_dir=out, print_period=0, background=False, ops=True) as prof:
        for _ in range(2):
            work.forward().backward()
            work.model.zero_grad(set_to_none=True)
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    # The blocks are named, as when this table was first measured: the chain finder used to rank candidates
    # without the loss's options and, with a large vocabulary, preferred (model, lm_head), whose loss cannot be
    # chunked. It now counts them and finds the layers itself (tests/planner/discovery/test_loss_ranking.py).
    blocks = [name for name, module in work.model.named_modules() if any(module is b for b in work.blocks)]
    chains = {cost: activations_chain(chain_from_trace(trace, checkpoints=blocks, recompute_cost=cost))
              for cost in ("time", "flops")}
    print(f"  chain: {chains['time'].length} stages, {sum(len(s.options) for s in chains['time'].stages)} options "
          f"by time, {sum(len(s.options) for s in chains['flops'].stages)} by FLOPs", flush=True)
    return chains


def _measure_applied(work: Workload, schedule: Schedule, method: str, setting: str, repeats: int) -> Point:
    from planner.executor import apply_schedule, remove_schedule

    apply_schedule(work.model, schedule)
    try:
        return measure(method, setting, work.forward, repeats,
                       note=f"predicted chain peak {format_bytes(schedule.predicted_peak_bytes or 0)}")
    finally:
        remove_schedule(work.model)
        work.model.zero_grad(set_to_none=True)


def planned_points(work: Workload, chains: dict[str, Chain], repeats: int, budgets: int,
                   algorithms: tuple[str, ...] = ("rotor", "selective")) -> list[Point]:
    """memprof rotor and selective (those of ``algorithms``) at the same ``budgets`` peak budgets on the chain's
    activations, from the lowest any of them reaches to store-all's (rotor skips those below its own minimum)."""
    from planner import min_feasible_budget, solve, store_all_budget

    methods = tuple(m for m in (("rotor", "time"), ("selective", "time"), ("selective", "flops")) if m[0] in algorithms)
    if not methods:
        return []
    floors = {(algorithm, cost): min_feasible_budget(chains[cost], algorithm) for algorithm, cost in methods}
    for (algorithm, cost), floor in floors.items():
        print(f"  minimum activations budget, {algorithm} ({cost}): {format_bytes(floor)}", flush=True)
    low = min(floors.values())
    high = max(store_all_budget(chains[cost]) for _, cost in methods)
    points: list[Point] = []
    for algorithm, cost in methods:
        chain = chains[cost]
        method = f"memprof {algorithm}" + (f" ({cost})" if algorithm == "selective" else "")
        seen: set[tuple] = set()
        for i in range(budgets):
            budget = low + (high - low) * i // max(budgets - 1, 1)
            if budget < floors[(algorithm, cost)]:
                continue
            schedule = solve(chain, budget, algorithm)
            if schedule.ops not in seen:
                seen.add(schedule.ops)
                points.append(_measure_applied(work, schedule, method, f"activations budget {format_bytes(budget)}",
                                               repeats))
    return points


def held_points(work: Workload, chains: dict[str, Chain], repeats: int, fractions: tuple[float, ...]) -> list[Point]:
    """memprof ``solve_held`` at ``fractions`` of what the chain's blocks hold keeping everything."""
    from planner import solve_held
    from planner.solvers.held import store_all_held_bytes

    points: list[Point] = []
    for cost in ("time", "flops"):
        chain = chains[cost]
        seen: set[tuple] = set()
        for fraction in fractions:
            budget = int(fraction * store_all_held_bytes(chain))
            schedule = solve_held(chain, budget)
            if schedule.ops not in seen:
                seen.add(schedule.ops)
                points.append(_measure_applied(work, schedule, f"memprof held ({cost})",
                                               f"held budget {format_bytes(budget)} ({fraction:.2f}x)", repeats))
    return points


def table(points: list[Point], state_bytes: int) -> str:
    """The Markdown table, ratios against plain autograd (the first point); the step peak adds ``state_bytes``
    (parameters and their gradients) to each fwd+bwd peak."""
    base = points[0]
    lines = ["| method | setting | activations held | x store-all | saved (hooks) | fwd+bwd peak | x store-all | "
             "step peak | x store-all | fwd+bwd GFLOP | FLOPs vs store-all | step ms | time vs store-all |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        hooks = format_bytes(p.hooks_bytes) if p.hooks_bytes is not None else "-"
        lines.append(
            f"| {p.method} | {p.setting} | {format_bytes(p.held_bytes)} | {p.held_bytes / base.held_bytes:.3f}x | "
            f"{hooks} | {format_bytes(p.peak_bytes)} | {p.peak_bytes / base.peak_bytes:.2f}x | "
            f"{format_bytes(state_bytes + p.peak_bytes)} | "
            f"{(state_bytes + p.peak_bytes) / (state_bytes + base.peak_bytes):.2f}x | "
            f"{p.flops / 1e9:.1f} | {100 * (p.flops / base.flops - 1):+.1f}% | {_ms(p.step_ms)} | "
            f"{_percent(p.step_ms / base.step_ms - 1)} |"
        )
    return "\n".join(lines)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:+.1f}%"


SIZES = {  # --model: layers, width, heads, vocabulary, batch, sequence (and --quick's)
    "gpt2": ((12, 768, 12, 50257, 2, 256), (4, 256, 4, 1000, 2, 256)),
    "llama": ((4, 128, 4, 128256, 1, 512), (2, 128, 4, 32000, 1, 256)),
}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=tuple(SIZES), default="gpt2")
    for name in ("layers", "width", "heads", "vocab", "batch", "seq"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per point (0: bytes and FLOPs only)")
    parser.add_argument("--budgets", type=int, default=8)
    parser.add_argument("--compile-budgets", type=_fractions, default=(*COMPILE_BUDGETS, 0.0),
                        help="torch.compile's activation_memory_budget values, comma-separated")
    parser.add_argument("--held-fractions", type=_fractions, default=HELD_FRACTIONS,
                        help="solve_held budgets as fractions of what the blocks and the loss hold keeping everything")
    parser.add_argument("--quick", action="store_true", help="a small model of the same kind (smoke run)")
    parser.add_argument("--methods", type=_methods, default=METHODS,
                        help=f"comma-separated, of {','.join(METHODS)} (plain autograd is always measured)")
    args = parser.parse_args(argv)
    sizes = dict(zip(("layers", "width", "heads", "vocab", "batch", "seq"), SIZES[args.model][int(args.quick)]))
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    make = build if args.model == "gpt2" else build_llama
    work = make(args.layers, args.width, args.heads, args.batch, args.seq, args.vocab)
    params = sum(p.numel() for p in work.model.parameters())
    print(f"{work.name} {args.layers} layers x {args.width} ({params / 1e6:.0f}M parameters), vocabulary {args.vocab}, "
          f"batch {args.batch} x {args.seq} tokens, fp32, {torch.get_num_threads()} threads", flush=True)
    points = [measure("plain autograd", "store all", work.forward, args.repeats, hooks_of=work.model)]
    state = state_bytes(work.model)  # the warm-up step left every parameter gradient allocated
    for every, setting in ((1, "every block"), (2, "every other block")) if "checkpoint" in args.methods else ():
        with blocks_checkpointed(work.blocks, every):
            points.append(measure("torch.utils.checkpoint", setting, work.forward, args.repeats))
    if "compile" in args.methods:
        points += compiled_points(work, args.repeats, args.compile_budgets)
    if {"rotor", "selective", "held"} & set(args.methods):
        with tempfile.TemporaryDirectory() as tmp:
            chains = profiled_chains(work, Path(tmp))
        points += planned_points(work, chains, args.repeats, args.budgets, args.methods)
        if "held" in args.methods:
            points += held_points(work, chains, args.repeats, args.held_fractions)
    text = table(points, state)
    print(text)
    return text


def _methods(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"methods are some of {','.join(METHODS)}, found {text!r}")
    return names


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 1.0,0.5,0.1, found {text!r}") from None
    if not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"fractions lie in [0, 1], found {text!r}")
    return values


if __name__ == "__main__":
    main()
