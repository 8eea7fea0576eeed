"""What the Planner view needs from the planner, cached per run: chain, Pareto front, measured runs.

The dashboard computes no schedule itself: one DP solve (``planner.pareto_front``) per run and chain
is cached, and the budget slider only reads it (``ParetoFront.schedule_at``) and asks the planner's
simulator for the predicted timeline.

A chain found in a run carries the step around it (``chain.step``, :class:`planner.step.StepCosts`), and
then every budget, peak and measurement here is the whole training step's memory, what the device has:
the predicted timeline is the simulator's chain timeline plus what the step holds beside the chain
(``base_bytes``), and the measured one is the allocator's, with nothing taken away.

A chain whose stages carry recomputation options (a run with a planning pass, ``memprof profile-ops``) is
planned with ``selective`` (rotor where each recorded forward picks an option), whose front the slider then
reads; torch.compile's measured points (``compile_points.json`` beside the run) join the Pareto figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import planner
from dashboard.data import TraceStore
from dashboard.figures_options import pareto_with_options
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
            (:func:`dashboard.figures_options.pareto_with_options`); shared, never modified.
        compile_points: torch.compile's measured points stored beside the run
            (``planner.compile_baseline.CompilePoint``; empty when the run has none).
        compile_error: why the stored points could not be read ("" when they could, or there are none).
    """

    chain: Any
    front: Any
    points: pd.DataFrame
    model_state_bytes: int
    pareto: dict[str, Any]
    compile_points: tuple[Any, ...] = ()
    compile_error: str = ""

    @property
    def algorithm(self) -> str:
        """The DP whose front the slider reads: ``"selective"`` when a stage has options, ``"rotor"`` otherwise."""
        return str(self.front.algorithm)

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
    # the points file is written after the run (profile-ops --compile-baseline): its stamp is part of the key
    key = ("planner", container, _points_stamp(store.path(name)))
    return store.memo(name, key, lambda run_dir: _build_model(store, name, container, run_dir))


def front_algorithm(chain: Any) -> str:
    """``"selective"`` when some stage has recomputation options, else ``"rotor"``: the slider's DP."""
    from planner.points import has_options

    return "selective" if has_options(chain) else "rotor"


def _points_stamp(run_dir: Path) -> int:
    from planner.compile_baseline import POINTS_FILE

    try:
        return os.stat(run_dir / POINTS_FILE).st_mtime_ns
    except OSError:
        return 0


def read_compile_points(run_dir: Path) -> tuple[tuple[Any, ...], str]:
    """torch.compile's points stored beside a run, and why they could not be read ("" when they could).

    A malformed file does not take the Planner view down: its points are left out and the figure says why.
    """
    from planner.compile_baseline import read_points

    try:
        return tuple(read_points(run_dir)), ""
    except (planner.ChainError, OSError) as exc:
        return (), str(exc)


def model_of_chain(chain: Any, state_bytes: int = 0, compile_points: tuple[Any, ...] = (),
                   compile_error: str = "") -> PlannerModel:
    """The planner model of ``chain``: one DP front (selective's when it has options), every algorithm's
    points and the fixed part of the Pareto figure, with torch.compile's points beside them."""
    front = planner.pareto_front(chain, front_algorithm(chain))
    points = planner.algorithm_points(chain)
    pareto = pareto_with_options(points, front.budgets_bytes, front.makespans_ms, front.algorithm,
                                 whole_step=chain.step is not None, compile_points=compile_points,
                                 compile_error=compile_error)
    return PlannerModel(chain, front, points, state_bytes, pareto, compile_points, compile_error)


def _build_model(store: TraceStore, name: str, container: str | None, run_dir: Path) -> PlannerModel:
    chain = planner.chain_from_trace(store.trace(name), container=container)
    compile_points, error = read_compile_points(run_dir)
    return model_of_chain(chain, model_state_bytes(store.iterations(name)), compile_points, error)


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


#: Columns :func:`with_option_columns` adds: the ``F_all``'s option (0: keeps everything), its name, what it
#: keeps, what ``B`` recomputes, and what keeping everything keeps (a-bar^l).
OPTION_COLUMNS = ("option", "option_name", "option_saved_bytes", "option_recompute_ms", "stage_saved_bytes")


def with_option_columns(frame: pd.DataFrame, prediction: Any, chain: Any) -> pd.DataFrame:
    """``frame`` (:func:`prediction_frame` of ``prediction``) with ``OPTION_COLUMNS`` when some ``F_all`` uses
    a recomputation option.

    Rows without an option get 0, ``""`` and zeros. A schedule without any option gives ``frame`` as is (no
    copy: it is drawn as before).
    """
    options = [p.op.option for p in prediction.timeline]
    if not any(options):
        return frame
    names, saved, recompute, full = [], [], [], []
    for stage, option in zip(frame["stage"].to_numpy(dtype=int), options):
        if option > 0:
            chosen = chain.stage(int(stage)).options[int(option) - 1]
            names.append(chosen.name)
            saved.append(int(chosen.saved_bytes))
            recompute.append(float(chosen.recompute_ms))
            full.append(int(chain.stage(int(stage)).saved_bytes))
        else:
            names.append("")
            saved.append(0)
            recompute.append(0.0)
            full.append(0)
    return frame.assign(option=options, option_name=names, option_saved_bytes=saved, option_recompute_ms=recompute,
                        stage_saved_bytes=full)


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
