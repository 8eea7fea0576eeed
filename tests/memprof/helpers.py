"""Helpers for the profiler tests: run a few profiled steps and read the trace back."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from memprof import MemoryProfiler, Trace, load_trace, zoo

CATEGORIES = ["weights", "buffers", "weight_grads", "feature_maps", "grads", "optimizer_state", "inputs", "other"]


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
