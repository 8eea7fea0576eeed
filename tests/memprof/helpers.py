"""Helpers for the profiler tests: run a few profiled steps and read the trace back."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, Trace, load_trace

CATEGORIES = ["weights", "buffers", "weight_grads", "feature_maps", "weight_copies", "grads", "optimizer_state",
              "comm_buffers", "inputs", "other"]


@contextlib.contextmanager
def without_collector() -> Iterator[None]:
    """Collects the garbage earlier tests left, then keeps the cycle collector off: tests that compare allocation
    sequences byte for byte (one iteration against the next, or against torch.profiler's) would otherwise see an
    earlier test's tensors freed wherever a collection happens to run (a threshold of 1 made them fail, before
    memprof's phase clock too)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def profile_steps(model: nn.Module, make_batch, out_dir: Path, steps: int = 3, batch_size: int = 8,
                  optimizer: torch.optim.Optimizer | None = None, set_to_none: bool = True,
                  background: bool = True, ops: bool = False) -> Trace:
    """Runs ``steps`` training steps under a MemoryProfiler (``ops``: with a planning pass) and returns the trace."""
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=background,
                        ops=ops) as profiler:
        for _ in range(steps):
            batch = make_batch(batch_size)  # one batch alive at a time, as with a data loader
            zoo.train_step(model, optimizer, batch, set_to_none=set_to_none)
            profiler.record_stats()
            del batch
    return load_trace(profiler.run_dir)


def forward_exit(trace: Trace, iteration: int):
    """The events row where the root module's forward returned."""
    ev = trace.events
    rows = ev[(ev.iteration == iteration) & (ev.module == "") & (ev.phase == "forward") & (ev.event == "exit")]
    assert len(rows) == 1
    return rows.iloc[0]


#: ``nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))``'s parameters, by hand: (8*16 + 16 + 16*4 + 4) * 4 B.
TINY_MLP_WEIGHT_BYTES = (8 * 16 + 16 + 16 * 4 + 4) * 4


def assert_exact_model_bytes(trace: Trace, weight_bytes: int, steady: bool = True) -> None:
    """What a trace that went through the journal, the worker, a crash or a recovery must still say.

    Every events row and every iteration holds the model's weights to the byte (computed by hand from the
    shapes, not read from memprof), no category is ever negative, and with ``steady`` every iteration after
    the first (identical steps of a deterministic model, the optimizer's state made in the first) peaks at the
    same bytes: a row torn, garbled, shifted or taken from another iteration breaks one of these, where
    "the categories sum to ``allocated_bytes``" held by construction.
    """
    events, iterations = trace.events, trace.iterations
    assert (events.weights == weight_bytes).all() and (iterations.weights == weight_bytes).all()
    assert (events[CATEGORIES] >= 0).all().all() and (iterations[CATEGORIES] >= 0).all().all()
    if steady:
        later = iterations[iterations.iteration >= 1].peak_allocated_bytes
        assert later.nunique() <= 1, later.tolist()
