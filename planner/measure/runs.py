"""Predicted against measured: run a schedule on the model under the profiler.

A measured run is an ordinary trace whose ``meta.json`` also holds ``schedule`` (the schedule's
JSON) and ``source_run`` (the run its chain came from), so the dashboard can draw the measured
timeline over the predicted one. :func:`planner.measure.comparison.compare` reads it against the schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprof import MemoryProfiler, Trace, load_trace
from memprof.trace.format.writer import write_meta
from planner.measure.comparison import TIMED_KEY, Comparison, compare
from planner.model.schedule import Schedule


def measure_schedule(model: nn.Module, make_batch: Callable[[int], Any], schedule: Schedule, out_dir: str | Path,
                     container: str | None = None, steps: int = 4, batch_size: int = 8,
                     run_id: str | None = None, source_run: str | None = None,
                     loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
                     optimizer: torch.optim.Optimizer | None = None,
                     timed_steps: int = 3) -> tuple[Trace, Comparison]:
    """Applies ``schedule`` to ``model`` (in place), profiles a few training steps and compares them.

    The peaks are the profiled steps'; the step time is timed without the profiler, over ``timed_steps`` more
    steps (the profiler's hooks slow the forward down: the predicted makespan is the step's without them,
    :mod:`planner.discovery.time_scale`).

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
        timed_steps: steps timed without the profiler after the profiled ones (their median is the
            comparison's ``measured_step_ms``; their times go into the run's ``meta.json``, key
            ``timed_step_ms``); 0: the profiled run's own clock
            (:func:`planner.measure.comparison.compute_ms`).
    """
    from planner.executor import apply_schedule

    if isinstance(timed_steps, bool) or not isinstance(timed_steps, int) or timed_steps < 0:
        raise ValueError(f"timed_steps must be a whole number >= 0, found {timed_steps!r}")
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3)
    step_loss = loss or _cross_entropy
    apply_schedule(model, schedule, container, optimizer=optimizer)
    meta = {"schedule": schedule.to_dict(), "source_run": source_run, "container": container}
    # Inline processing: in a run of a few timed steps the background worker's start-up (about 0.4 s of
    # CPU) would run beside them and, on a machine without an idle core, slow exactly what is measured.
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=run_id, print_period=0, extra_meta=meta,
                        background=False) as prof:
        for _ in range(steps):
            batch = make_batch(batch_size)  # one batch alive at a time, as with a data loader
            optimizer.zero_grad(set_to_none=True)
            step_loss(model, batch).backward()
            optimizer.step()
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    if timed_steps:
        # kept in the run's meta.json: the dashboard's comparison of the run on disk is this one
        trace.meta[TIMED_KEY] = [round(_timed_step_ms(model, make_batch(batch_size), step_loss, optimizer), 4)
                                 for _ in range(timed_steps)]
        write_meta(prof.run_dir, trace.meta)
    return trace, compare(schedule, trace)


def _timed_step_ms(model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], torch.Tensor],
                   optimizer: torch.optim.Optimizer) -> float:
    """One training step; the milliseconds of its forward and backward (waiting for the device's kernels),
    the optimizer's step left out as the makespan leaves it."""
    optimizer.zero_grad(set_to_none=True)
    _synchronize()
    started = time.perf_counter()
    loss(model, batch).backward()
    _synchronize()
    elapsed_ms = (time.perf_counter() - started) * 1e3
    optimizer.step()
    return elapsed_ms


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _cross_entropy(model: nn.Module, batch: Any) -> torch.Tensor:
    """The default loss: cross-entropy of ``model(inputs)`` against ``targets``."""
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)
