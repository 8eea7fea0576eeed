"""Predicted against measured: run a schedule on the model under the profiler.

A measured run is an ordinary trace whose ``meta.json`` also holds ``schedule`` (the schedule's
JSON) and ``source_run`` (the run its chain came from), so the dashboard can draw the measured
timeline over the predicted one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprof import MemoryProfiler, Trace, load_trace
from memprof.zoo import train_step
from planner.schedule import Schedule


@dataclass(frozen=True)
class Comparison:
    """A schedule's prediction beside what was measured when it ran.

    Attributes:
        predicted_peak_bytes: the simulator's peak of the chain (the paper's M: activations, gradients,
            overheads).
        measured_peak_bytes: the highest activation memory measured (allocated minus model state).
        predicted_makespan_ms: the simulator's makespan (sum of op times).
        measured_step_ms: median measured time of forward + backward (optimizer excluded).
        predicted_step_peak_bytes: the predicted peak of the whole training step (``None`` for a chain
            without step costs).
        measured_step_peak_bytes: the highest allocated memory of a whole step, as the allocator saw it.
    """

    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_makespan_ms: float
    measured_step_ms: float
    predicted_step_peak_bytes: int | None = None
    measured_step_peak_bytes: int = 0

    @property
    def peak_error(self) -> float:
        """Relative error of the whole step's peak when predicted, else of the chain's (measured / predicted - 1)."""
        if self.predicted_step_peak_bytes is not None:
            return self.measured_step_peak_bytes / max(self.predicted_step_peak_bytes, 1) - 1
        return self.measured_peak_bytes / max(self.predicted_peak_bytes, 1) - 1


def step_peak_bytes(trace: Trace, skip_first: bool = True) -> int:
    """Highest allocated memory of a whole training step over the recorded iterations (the first skipped)."""
    iterations = trace.iterations
    if skip_first and len(iterations) > 1:
        iterations = iterations[iterations.iteration != iterations.iteration.min()]
    return int(iterations.peak_allocated_bytes.max())


def activation_peak_bytes(trace: Trace, skip_first: bool = True) -> int:
    """Highest activation memory (allocated minus model state) over the recorded iterations."""
    events = trace.read("events", columns=["iteration", "peak_activation_bytes"])
    if skip_first and events.iteration.nunique() > 1:
        events = events[events.iteration != events.iteration.min()]
    return int(events.peak_activation_bytes.max())


def compute_ms(trace: Trace, skip_first: bool = True) -> float:
    """Median time from the first forward enter to the end of backward, per iteration."""
    events = trace.read("events", columns=["iteration", "time_ns", "phase", "event"])
    if skip_first and events.iteration.nunique() > 1:
        events = events[events.iteration != events.iteration.min()]
    starts = events[(events.phase == "forward") & (events.event == "enter")].groupby("iteration").time_ns.min()
    ends = events[(events.phase == "backward") & (events.event == "end")].groupby("iteration").time_ns.max()
    return float(((ends - starts) / 1e6).median())


def measure_schedule(model: nn.Module, make_batch: Callable[[int], Any], schedule: Schedule, out_dir: str | Path,
                     container: str | None = None, steps: int = 4, batch_size: int = 8,
                     run_id: str | None = None, source_run: str | None = None,
                     loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
                     optimizer: torch.optim.Optimizer | None = None) -> tuple[Trace, Comparison]:
    """Applies ``schedule`` to ``model`` (in place) and profiles a few training steps.

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

    apply_schedule(model, schedule, container)
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3)
    meta = {"schedule": schedule.to_dict(), "source_run": source_run, "container": container}
    # Inline processing: in a run of a few timed steps the background worker's start-up (about 0.4 s of
    # CPU) would run beside them and, on a machine without an idle core, slow exactly what is measured.
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=run_id, print_period=0, extra_meta=meta,
                        background=False) as prof:
        for _ in range(steps):
            batch = make_batch(batch_size)  # one batch alive at a time, as with a data loader
            if loss is None:
                train_step(model, optimizer, batch)
            else:
                optimizer.zero_grad(set_to_none=True)
                loss(model, batch).backward()
                optimizer.step()
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    comparison = Comparison(
        predicted_peak_bytes=int(schedule.predicted_peak_bytes or 0),
        measured_peak_bytes=activation_peak_bytes(trace),
        predicted_makespan_ms=float(schedule.predicted_makespan_ms or 0.0),
        measured_step_ms=compute_ms(trace),
        predicted_step_peak_bytes=schedule.predicted_step_peak_bytes,
        measured_step_peak_bytes=step_peak_bytes(trace),
    )
    return trace, comparison
