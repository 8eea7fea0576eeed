"""Measured runs of a schedule from the Planner's run: found beside it, compared with the planner, drawn over it.

A measured run is an ordinary trace whose ``meta.json`` holds the ``schedule`` it executed and its
``source_run`` (``planner.measure_schedule``). Its numbers are the planner's comparison
(``planner.compare``); its line is what the allocator held over one iteration, moved onto the prediction's
clock operation by operation (:func:`aligned_to_prediction`, :mod:`dashboard.align`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

import planner
from dashboard.align import op_anchors, warp
from dashboard.data import TraceStore
from dashboard.planning import prediction_frame
from memprof.categories import MODEL_STATE
from memprof.phases import CHAIN_PHASES, STEP_PHASES
from planner import Chain, Comparison, Schedule, compare

#: Columns of a measured memory line (:func:`measured_step`, :func:`measured_activation`).
MEASURED_COLUMNS = ("time_ms", "memory_bytes", "peak_bytes")


def measured_runs(store: TraceStore, run_id: str) -> list[str]:
    """Names of the readable runs that executed a schedule made from run ``run_id``."""
    names = []
    for entry in store.runs():
        meta = entry.meta or {}
        if isinstance(meta.get("schedule"), dict) and str(meta.get("source_run")) == str(run_id):
            names.append(entry.name)
    return names


def _empty_measured() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in MEASURED_COLUMNS})


def _origin_ms(inside: pd.DataFrame) -> float:
    forward = inside[inside["phase"].astype(str) == "forward"]
    return float(forward["time_ms"].iloc[0]) if not forward.empty else float(inside["time_ms"].iloc[0])


def measured_step(frame: pd.DataFrame) -> pd.DataFrame:
    """The whole step's allocated memory over forward, backward and the optimizer step of one measured iteration.

    What the allocator held, nothing taken away: the quantity a whole-step prediction predicts. Time is in ms
    since the iteration's first forward event, as in a schedule's prediction.

    Returns:
        Columns ``MEASURED_COLUMNS``: ``time_ms``, ``memory_bytes`` (allocated) and ``peak_bytes`` (the
        allocator's peak since the previous event).
    """
    inside = frame[frame["phase"].astype(str).isin([p.value for p in STEP_PHASES])]
    if inside.empty:
        return _empty_measured()
    return pd.DataFrame({
        "time_ms": inside["time_ms"].to_numpy() - _origin_ms(inside),
        "memory_bytes": inside["allocated_bytes"].to_numpy(dtype=np.int64),
        "peak_bytes": inside["peak_bytes"].to_numpy(dtype=np.int64),
    })


def measured_activation(frame: pd.DataFrame) -> pd.DataFrame:
    """Activation memory over forward and backward of one measured iteration (for chain-only schedules).

    Activation bytes are allocated bytes minus the model-state categories; time is in ms since the
    iteration's first forward event, as in a schedule's prediction.

    Returns:
        Columns ``MEASURED_COLUMNS``: ``time_ms``, ``memory_bytes`` (activations) and ``peak_bytes`` (the
        highest since the previous event, less the model state at the event).
    """
    inside = frame[frame["phase"].astype(str).isin([p.value for p in CHAIN_PHASES])]
    if inside.empty:
        return _empty_measured()
    state = sum(inside[c.value].to_numpy(dtype=np.int64) for c in MODEL_STATE)
    return pd.DataFrame({
        "time_ms": inside["time_ms"].to_numpy() - _origin_ms(inside),
        "memory_bytes": inside["allocated_bytes"].to_numpy(dtype=np.int64) - state,
        "peak_bytes": inside["peak_bytes"].to_numpy(dtype=np.int64) - state,
    })


@dataclass(frozen=True)
class MeasuredRun:
    """A measured run of a schedule: the lines drawn and the planner's comparison of its numbers.

    Attributes:
        name: the measured run's name.
        schedule: the schedule it executed (``planner.Schedule``).
        predicted: the simulator's frame of that schedule (:func:`prediction_frame`; the chain's memory).
        measured: :func:`measured_step` (or :func:`measured_activation` for a chain-only schedule) of its
            last iteration (the line drawn).
        comparison: predicted against measured peaks and times (``planner.Comparison``): the whole training
            step's peaks when the schedule's chain has step costs, the chain's activation memory otherwise.
    """

    name: str
    schedule: Schedule
    predicted: pd.DataFrame
    measured: pd.DataFrame
    comparison: Comparison

    @property
    def whole_step(self) -> bool:
        """Whether the peaks compared are the whole training step's."""
        return self.comparison.whole_step

    @property
    def base_bytes(self) -> int | None:
        """What the step holds beside the chain, added to the simulator's timeline when drawn (``None``: chain-only)."""
        step = self.schedule.step  # with streamed weights, their resident state is in host memory
        return step.base_bytes if step is not None else None

    @property
    def floor_bytes(self) -> int | None:
        """The step's peak outside the chain, which no schedule lowers; ``None`` for a chain-only schedule."""
        step = self.schedule.step
        return step.floor_bytes if step is not None else None


def compare_measured(store: TraceStore, name: str) -> MeasuredRun:
    """Measured against predicted for a measured run (cached per run stamp).

    Raises:
        planner.errors.InvalidScheduleError: the run's ``schedule`` is not a valid schedule.
        memprof.errors.TraceError: the run cannot be read.
    """
    return store.memo(name, "measured", lambda _: _compare(store, name))


def _compare(store: TraceStore, name: str) -> MeasuredRun:
    schedule = planner.Schedule.from_json(store.meta(name)["schedule"])
    prediction = planner.simulate(schedule.chain, schedule)
    detailed = store.detail_iterations(name)
    last = int(detailed[-1]) if len(detailed) else 0  # the last iteration with a timeline
    frame = store.timeline(name, last)
    # whole step: the allocator's memory; chain-only: activation memory (allocated minus model state)
    measured = measured_step(frame) if schedule.chain.step is not None else measured_activation(frame)
    predicted = prediction_frame(prediction)
    measured = aligned_to_prediction(measured, frame, predicted, schedule.chain)
    # The numbers are the planner's measurement (over the recorded iterations, the first one excluded
    # when there are more); the line drawn is the last iteration.
    comparison = compare(schedule, store.trace(name), prediction)
    if not np.isfinite(comparison.measured_step_ms):  # no "backward end" event: the drawn iteration's span
        span = float(measured["time_ms"].iloc[-1]) if not measured.empty else 0.0
        comparison = replace(comparison, measured_step_ms=span)
    return MeasuredRun(name, schedule, predicted, measured, comparison)


def aligned_to_prediction(measured: pd.DataFrame, events: pd.DataFrame, predicted: pd.DataFrame,
                          chain: Chain) -> pd.DataFrame:
    """A measured line moved onto the prediction's clock, operation by operation (``dashboard.align.op_anchors``).

    The measured run is slower under the profiler than predicted; mapped at each operation's start, its shape
    overlays the prediction's. Its own times stay in ``measured_ms``. Returned as is when no operation is found.
    """
    if measured.empty or events.empty:
        return measured
    source, target = op_anchors(events, predicted, [tuple(stage.modules) for stage in chain.stages])
    if len(source) < 2:
        return measured
    phases = events["phase"].astype(str)
    inside = events[phases.isin([p.value for p in STEP_PHASES])]
    origin = _origin_ms(inside) if not inside.empty else 0.0
    times = measured["time_ms"].to_numpy(dtype=float)
    return measured.assign(measured_ms=times, time_ms=warp(times, source - origin, target))


def same_schedule(a: Schedule, b: Schedule) -> bool:
    """Whether two schedules run the same operations on the same chain."""
    return tuple(a.ops) == tuple(b.ops) and a.chain.fingerprint() == b.chain.fingerprint()
