"""Selective recomputation of one stage: ``F_all(l)[k]`` keeps the outputs of some ops and recomputes the rest.

The stage runs under non-reentrant ``torch.utils.checkpoint`` with a selective policy
(``create_selective_checkpoint_contexts``): the ops the option keeps are ``MUST_SAVE`` (their outputs are
cached in the forward and handed back in the recomputation), every other op is recomputed when autograd
reaches the stage's backward. Ops are named by aten overload and occurrence (the 3rd ``aten.addmm.default``
of the stage's forward), the way the policy's own cache counts them, so ops it ignores (``detach``) cannot
shift the count. A kept output that the forward then changes in place is refused by PyTorch's cache check
(an error, never a wrong gradient).

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

Policy = tuple[tuple[str, int], ...]
"""The ops an option keeps: ``(aten overload name, occurrence among the stage's ops of that name)``."""


def split_option(kind: str) -> tuple[str, int]:
    """``"F_all[2]"`` -> ``("F_all", 2)``; a kind without an option -> ``(kind, 0)``."""
    if kind.endswith("]") and "[" in kind:
        base, _, rest = kind.partition("[")
        return base, int(rest[:-1])
    return kind, 0


def with_option(kind: str, option: int) -> str:
    """The kind the runtime runs: ``"F_all[2]"`` for option 2, ``kind`` itself for option 0."""
    return f"{kind}[{option}]" if option else kind


def _contexts(policy: Policy) -> tuple[Any, Any]:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    kept = frozenset(policy)
    seen: dict[str, int] = {}

    def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(func)
        occurrence = seen.get(name, 0)
        seen[name] = occurrence + 1
        return CheckpointPolicy.MUST_SAVE if (name, occurrence) in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(choose)


def run_selective(call: Callable[[torch.Tensor], Any], x: torch.Tensor, policy: Policy,
                  recompute: Callable[[Callable[[], Any]], Any]) -> Any:
    """``call(x)`` under non-reentrant checkpointing that keeps the outputs of ``policy``'s ops.

    Args:
        call: runs the stage on its input.
        x: the stage's input (kept by the checkpoint for the recomputation).
        policy: the ops whose outputs are kept.
        recompute: wraps the recomputation (``recompute(thunk)`` runs ``thunk()``), e.g. to freeze batch-norm
            running statistics that the first run already updated.
    """
    from torch.utils.checkpoint import checkpoint

    runs = [0]

    def body(inp: torch.Tensor) -> Any:
        runs[0] += 1
        if runs[0] == 1:
            return call(inp)
        return recompute(lambda: call(inp))

    return checkpoint(body, x, use_reentrant=False, preserve_rng_state=True,
                      context_fn=functools.partial(_contexts, tuple(policy)))


def policy_of(save_ops: Sequence[str], occurrences: Sequence[int]) -> Policy:
    """The policy of an option from its kept ops' names and occurrences."""
    return tuple((str(name), int(n)) for name, n in zip(save_ops, occurrences))
