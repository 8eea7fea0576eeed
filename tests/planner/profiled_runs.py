"""A real model's training steps under memprof's profiler, as the planner's tests profile them."""

from __future__ import annotations

from pathlib import Path

import torch

from memprof import MemoryProfiler
from tests.planner.real_models import RealModel


def profile_steps(real: RealModel, optimizer: torch.optim.Optimizer, out_dir: Path, steps: int, batch_size: int,
                  ops: bool = False) -> Path:
    """Trains ``real`` for ``steps`` steps under the profiler (inline, a new batch each step: one alive at a
    time, as with a data loader; ``ops``: iteration 1 is a planning pass) and returns the run's directory."""
    with MemoryProfiler(real.model, optimizer, out_dir=out_dir, print_period=0, background=False, ops=ops) as prof:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            real.loss(real.model, real.make_batch(batch_size)).backward()
            optimizer.step()
            prof.record_stats()
    return prof.run_dir
