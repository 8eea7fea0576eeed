"""Predicted against measured: run a schedule on the model under the profiler.

A measured run is an ordinary trace whose ``meta.json`` also holds ``schedule`` (the schedule's
JSON) and ``source_run`` (the run its chain came from), so the dashboard can draw the measured
timeline over the predicted one. :func:`planner.measure.comparison.compare` reads it against the schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprof import MemoryProfiler, Trace, load_trace
from planner.measure.comparison import Comparison, compare
from planner.model.schedule import Schedule


def measure_schedule(model: nn.Module, make_batch: Callable[[int], Any], schedule: Schedule, out_dir: str | Path,
                     container: str | None = None, steps: int = 4, batch_size: int = 8,
                     run_id: str | None = None, source_run: str | None = None,
                     loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
                     optimizer: torch.optim.Optimizer | None = None) -> tuple[Trace, Comparison]:
    """Applies ``schedule`` to ``model`` (in place), profiles a few training steps and compares them.

    Args:
        model: the model the chain was found in.
        make_batch: returns a batch for a batch size (``(inputs, targets)`` unless ``loss`` is given).
        schedule: the schedule to run.
        out_dir: where the measured run is written.
        container: for a chain whose stages name no modules, the container whose children are the stages.
        steps: training steps to record (the first is excluded from the comparison).
        batch_size: the batch size the chain was profiled with.
        run_id: name of the measured run.
        source_run: run id of the profiled run the chain came from.
        loss: ``loss(model, batch)`` returns the step's loss (default: cross-entropy of ``model(inputs)``).
        optimizer: the optimizer to step (default: SGD); use the one the chain was profiled with, so the
            measured step holds the same optimizer state as the predicted one.
    """
    from planner.executor import apply_schedule

    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3)
    apply_schedule(model, schedule, container, optimizer=optimizer)
    meta = {"schedule": schedule.to_dict(), "source_run": source_run, "container": container}
    # Inline processing: in a run of a few timed steps the background worker's start-up (about 0.4 s of
    # CPU) would run beside them and, on a machine without an idle core, slow exactly what is measured.
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=run_id, print_period=0, extra_meta=meta,
                        background=False) as prof:
        for _ in range(steps):
            batch = make_batch(batch_size)  # one batch alive at a time, as with a data loader
            optimizer.zero_grad(set_to_none=True)
            (loss or _cross_entropy)(model, batch).backward()
            optimizer.step()
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    return trace, compare(schedule, trace)


def _cross_entropy(model: nn.Module, batch: Any) -> torch.Tensor:
    """The default loss: cross-entropy of ``model(inputs)`` against ``targets``."""
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)
