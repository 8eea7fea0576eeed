"""What a selective activation checkpoint costs per op beyond the op itself, measured where the model trains.

Selective recomputation runs a block under non-reentrant ``torch.utils.checkpoint`` with a policy
(``create_selective_checkpoint_contexts``): a Python dispatch mode calls the policy on every op of the
forward and of the recomputation, caches the outputs it keeps and hands them back. On small tensors that
dispatch costs more than many ops do (about 15 us per op on the project's 2-core CPU, where a small
multiplication's forward and backward take 8), so an option's price is its recomputation plus this cost on
every op of the block. The planning pass (``MemoryProfiler(..., ops=True)``) measures it once on the model's
device and stores it in ``meta.json`` (``selective_overhead_us_per_op``); the planner adds it to each
option.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

OPS = 100
"""Ops in the measured chain."""

REPEATS = 7
"""Timed runs of each variant (the fastest is kept), after one warm-up."""


def selective_overhead_us(device: torch.device | str = "cpu", ops: int = OPS, repeats: int = REPEATS) -> float:
    """Microseconds a selective checkpoint adds per op to a forward + backward on ``device``.

    Measured on a chain of ``ops`` multiplications of a 16-element tensor, forward and backward: under a
    non-reentrant checkpoint whose policy keeps every output (the policy runs on each op twice, in the
    forward and in the recomputation, and every output is cached and handed back), less the same chain
    without it, divided by ``ops``; the fastest of ``repeats`` runs of each, at least 0. The two variants
    alternate run by run and the fastest run is kept because another process only ever adds time: a burst
    of load then slows both alike or neither's best run. On an accelerator the ops are
    launched asynchronously and the dispatch is CPU time: this measures it where the kernels are too small
    to hide it, an upper bound for blocks whose kernels take longer than their launch.

    Args:
        device: where the model's tensors are.
        ops: the chain's length.
        repeats: timed runs per variant.
    """
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(ops):
            x = x * 1.0001
        return x

    def keep_all(ctx: object, func: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE

    contexts = functools.partial(create_selective_checkpoint_contexts, keep_all)
    x = torch.ones(16, device=device, requires_grad=True)

    def plain() -> None:
        chain(x).sum().backward()

    def selective() -> None:
        checkpoint(chain, x, use_reentrant=False, context_fn=contexts).sum().backward()

    plain_s, selective_s = _fastest_s((plain, selective), repeats, x.device)
    return max(0.0, (selective_s - plain_s) * 1e6 / ops)


def _fastest_s(steps: tuple[Callable[[], None], ...], repeats: int, device: torch.device) -> list[float]:
    fastest = [float("inf")] * len(steps)
    for run in range(repeats + 1):
        for index, step in enumerate(steps):
            _synchronize(device)
            started = time.perf_counter()
            step()
            _synchronize(device)
            if run:  # the first run warms caches and lazy initialisation up
                fastest[index] = min(fastest[index], time.perf_counter() - started)
    return fastest


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
