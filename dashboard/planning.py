"""What the Planner view needs from the planner, cached per run: chain, Pareto front, measured runs.

The dashboard computes no schedule itself: one DP solve (``planner.pareto_front``) per run and chain
is cached, and the budget slider only reads it (``ParetoFront.schedule_at``) and asks the planner's
simulator for the predicted timeline.

A chain found in a run carries the step around it (``chain.step``, :class:`planner.step.StepCosts`), and
then every budget, peak and measurement here is the whole training step's memory, what the device has:
the predicted timeline is the simulator's chain timeline plus what the step holds beside the chain
(``base_bytes``), and the measured one is the allocator's, with nothing taken away.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

import planner
from dashboard.data import TraceStore
from dashboard.figures_planner import pareto_base
from memprof.categories import MODEL_STATE
from memprof.phases import CHAIN_PHASES, STEP_PHASES
from planner.comparison import Comparison, compare

#: Positions of the budget slider between the minimum feasible budget and store-all.
SLIDER_STEPS = 100
#: Columns of a measured memory line (:func:`measured_step`, :func:`measured_activation`).
MEASURED_COLUMNS = ("time_ms", "memory_bytes", "peak_bytes")


@dataclass(frozen=True)
class PlannerModel:
    """A run's chain with its one-solve Pareto front and every algorithm's points.

    Budgets and peaks are the whole training step's when the chain has step costs (:attr:`whole_step`),
    the chain's own (activations, their gradients, overheads) otherwise.

    Attributes:
        chain: the chain found in (or named in) the run.
        front: ``planner.pareto_front(chain)``; ``schedule_at`` reads it without solving again.
        points: ``planner.algorithm_points(chain)``: algorithm, budget_bytes, peak_bytes, makespan_ms, params.
        model_state_bytes: weights, buffers, weight gradients and optimizer state at the run's peak (what a
            chain-only budget leaves out).
        pareto: the part of the Pareto figure that does not move with the slider
            (:func:`dashboard.figures_planner.pareto_base`); shared, never modified.
    """

    chain: Any
    front: Any
    points: pd.DataFrame
    model_state_bytes: int
    pareto: dict[str, Any]

    @property
    def step(self) -> Any:
        """The chain's :class:`planner.step.StepCosts` (``None``: budgets count the chain only)."""
        return self.chain.step

    @property
    def whole_step(self) -> bool:
        """Whether budgets and peaks are the whole training step's memory."""
        return self.chain.step is not None

    @property
    def min_budget_bytes(self) -> int:
        """The smallest budget with a schedule (the slider's minimum)."""
        return int(self.front.min_feasible_bytes)

    @property
    def max_budget_bytes(self) -> int:
        """The store-all budget (the slider's maximum)."""
        return int(self.front.max_budget_bytes)

    def clamp(self, budget_bytes: float | None) -> int:
        """A budget from the browser, held inside the slider's range (the middle when missing)."""
        if budget_bytes is None or not np.isfinite(float(budget_bytes)):
            return default_budget(self)
        return int(min(max(round(float(budget_bytes)), self.min_budget_bytes), self.max_budget_bytes))


def default_budget(model: PlannerModel) -> int:
    """Where the slider starts: half-way between the minimum feasible budget and store-all."""
    return (model.min_budget_bytes + model.max_budget_bytes) // 2


def container_choices(layers: pd.DataFrame) -> list[str]:
    """Modules with at least two children, in forward order: the containers a chain can be taken from."""
    if layers.empty:
        return []
    first = layers[layers["iteration"] == layers["iteration"].min()]
    counts = first[first["module"] != ""].groupby("parent").size()
    parents = set(counts[counts >= 2].index)
    ordered = first.sort_values(["order", "module"], kind="stable")
    return [m for m in ordered["module"] if m in parents]


def model_state_bytes(iterations: pd.DataFrame) -> int:
    """Model-state bytes (the categories the budget leaves out) at the highest peak of a run."""
    if iterations.empty:
        return 0
    row = iterations.loc[iterations["peak_allocated_bytes"].idxmax()]
    return int(sum(int(row[c.value]) for c in MODEL_STATE))


def planner_model(store: TraceStore, name: str, container: str | None) -> PlannerModel:
    """The cached planner model of run ``name`` (one DP solve per run, container and run stamp).

    Raises:
        planner.errors.NotAChainError: no chain was found (or the container is not one).
        memprof.errors.TraceError: the run cannot be read.
    """
    container = container or None
    return store.memo(name, ("planner", container), lambda _: _build_model(store, name, container))


def _build_model(store: TraceStore, name: str, container: str | None) -> PlannerModel:
    chain = planner.chain_from_trace(store.trace(name), container=container)
    front = planner.pareto_front(chain)
    points = planner.algorithm_points(chain)
    pareto = pareto_base(points, front.budgets_bytes, front.makespans_ms, whole_step=chain.step is not None)
    return PlannerModel(chain, front, points, model_state_bytes(store.iterations(name)), pareto)


def prediction_frame(prediction: Any) -> pd.DataFrame:
    """The simulator's timeline as a table (``index, kind, stage, start_ms, end_ms, memory_bytes, peak_bytes,
    stream, host_bytes``).

    Like ``Prediction.to_frame`` without the ``live`` column, whose names cost more to build than the
    slider's whole time budget allows on long chains.
    """
    points = prediction.timeline
    return pd.DataFrame({
        "index": [p.index for p in points], "kind": [p.op.kind.value for p in points],
        "stage": [p.op.stage for p in points], "start_ms": [p.start_ms for p in points],
        "end_ms": [p.end_ms for p in points], "memory_bytes": [p.memory_bytes for p in points],
        "peak_bytes": [p.peak_bytes for p in points], "stream": [p.stream for p in points],
        "host_bytes": [p.host_bytes for p in points],
    })


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
    schedule: Any
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
        step = self.schedule.chain.step
        return step.base_bytes if step is not None else None

    @property
    def floor_bytes(self) -> int | None:
        """The step's peak outside the chain, which no schedule lowers; ``None`` for a chain-only schedule."""
        step = self.schedule.chain.step
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
    # The numbers are the planner's measurement (over the recorded iterations, the first one excluded
    # when there are more); the line drawn is the last iteration.
    comparison = compare(schedule, store.trace(name), prediction)
    if not np.isfinite(comparison.measured_step_ms):  # no "backward end" event: the drawn iteration's span
        span = float(measured["time_ms"].iloc[-1]) if not measured.empty else 0.0
        comparison = replace(comparison, measured_step_ms=span)
    return MeasuredRun(name, schedule, prediction_frame(prediction), measured, comparison)


def same_schedule(a: Any, b: Any) -> bool:
    """Whether two schedules run the same operations on the same chain."""
    return tuple(a.ops) == tuple(b.ops) and a.chain.fingerprint() == b.chain.fingerprint()
