"""What the Planner view needs from the planner, cached per run: the chain, its Pareto front, every algorithm's points.

The dashboard computes no schedule itself: one DP solve (``planner.pareto_front``) per run and chain
is cached, and the budget slider only reads it (``ParetoFront.schedule_at``) and asks the planner's
simulator for the predicted timeline.

A chain found in a run carries the step around it (``chain.step``, :class:`planner.model.step.StepCosts`), and
then every budget, peak and measurement here is the whole training step's memory, what the device has:
the predicted timeline is the simulator's chain timeline plus what the step holds beside the chain
(``base_bytes``), and the measured one is the allocator's, with nothing taken away.

A chain whose stages carry recomputation options (a run with a planning pass, ``memprof profile-ops``) is
planned with ``selective`` (rotor where each recorded forward picks an option), whose front the slider then
reads; torch.compile's measured points (``compile_points.json`` beside the run) join the Pareto figure.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

import planner
from dashboard.data import TraceStore
from dashboard.figures_options import pareto_with_options
from dashboard.figures_pareto import with_data_revision
from memprof.categories import MODEL_STATE

if TYPE_CHECKING:
    from planner import Chain, CompilePoint, ParetoFront, Prediction, StepCosts

#: Positions of the budget slider between the minimum feasible budget and store-all.
SLIDER_STEPS = 100


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
            (``planner.measure.compile_baseline.CompilePoint``; empty when the run has none).
        compile_error: why the stored points could not be read ("" when they could, or there are none).
    """

    chain: Chain
    front: ParetoFront
    points: pd.DataFrame
    model_state_bytes: int
    pareto: dict[str, Any]
    compile_points: tuple[CompilePoint, ...] = ()
    compile_error: str = ""

    @property
    def algorithm(self) -> str:
        """The DP whose front the slider reads: ``"selective"`` when a stage has options, ``"rotor"`` otherwise."""
        return str(self.front.algorithm)

    @property
    def step(self) -> StepCosts | None:
        """The chain's :class:`planner.model.step.StepCosts` (``None``: budgets count the chain only)."""
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
    """The cached planner model of run ``name``: one DP solve per run, container and set of planner inputs.

    Keyed on what the chain is built from (:func:`planner_inputs`), not on the run's stamp: a live run's new
    iterations without detail leave the model (and its Pareto front) as it is.

    Raises:
        planner.errors.NotAChainError: no chain was found (or the container is not one).
        memprof.errors.TraceError: the run cannot be read.
    """
    container = container or None
    run_dir = store.path(name)
    # the points file is written after the run (profile-ops --compile-baseline): its stamp is part of the key
    key = ("planner", str(run_dir), container, _points_stamp(run_dir), planner_inputs(store, name))
    return store.cache.get_or_build(key, lambda: _build_model(store, name, container, run_dir))


def planner_inputs(store: TraceStore, name: str) -> str:
    """A digest of what run ``name``'s planner model is built from; it changes only when a rebuilt model could
    differ (:func:`planner.chain_inputs`, the model state at the run's peak, the device).

    Cached on the run's stamp: a tick of a live run that wrote nothing costs no read.
    """
    def build(_: Path) -> str:
        trace = store.trace(name)
        inputs = (planner.chain_inputs(trace), model_state_bytes(store.iterations(name)), trace.meta.get("device"))
        return hashlib.sha1(repr(inputs).encode()).hexdigest()[:16]

    return store.memo(name, "planner-inputs", build)


def front_algorithm(chain: Chain) -> str:
    """``"selective"`` when some stage has recomputation options, else ``"rotor"``: the slider's DP."""
    from planner import has_options

    return "selective" if has_options(chain) else "rotor"


def _points_stamp(run_dir: Path) -> int:
    from planner import COMPILE_POINTS_FILE

    try:
        return os.stat(run_dir / COMPILE_POINTS_FILE).st_mtime_ns
    except OSError:
        return 0


def read_compile_points(run_dir: Path) -> tuple[tuple[CompilePoint, ...], str]:
    """torch.compile's points stored beside a run, and why they could not be read ("" when they could).

    A malformed file does not take the Planner view down: its points are left out and the figure says why.
    """
    from planner import read_compile_points

    try:
        return tuple(read_compile_points(run_dir)), ""
    except (planner.ChainError, OSError) as exc:
        return (), str(exc)


def model_of_chain(chain: Chain, state_bytes: int = 0, compile_points: tuple[CompilePoint, ...] = (),
                   compile_error: str = "", device_link: bool = True) -> PlannerModel:
    """The planner model of ``chain``: one DP front (selective's when it has options), every algorithm's
    points and the fixed part of the Pareto figure, with torch.compile's points beside them.

    ``device_link``: whether the run's device can copy to host memory; without one the offload points are
    drawn as needing a GPU (:func:`dashboard.figures_options.needs_a_gpu`)."""
    front = planner.pareto_front(chain, front_algorithm(chain))
    points = planner.algorithm_points(chain)
    pareto = pareto_with_options(points, front.budgets_bytes, front.makespans_ms, front.algorithm,
                                 whole_step=chain.step is not None, compile_points=compile_points,
                                 compile_error=compile_error, device_link=device_link)
    with_data_revision(pareto)  # the slider then moves the star without redrawing the traces
    return PlannerModel(chain, front, points, state_bytes, pareto, compile_points, compile_error)


def _build_model(store: TraceStore, name: str, container: str | None, run_dir: Path) -> PlannerModel:
    chain = planner.chain_from_trace(store.trace(name), container=container)
    compile_points, error = read_compile_points(run_dir)
    return model_of_chain(chain, model_state_bytes(store.iterations(name)), compile_points, error,
                          device_link=has_device_link(store.meta(name), chain))


def has_device_link(meta: dict[str, Any], chain: Any) -> bool:
    """Whether the run's offload points describe its own device: a CUDA run, or a chain with a measured link.

    A CPU run's chain prices offloading with the planner's default link (``planner.DEFAULT_TRANSFER``): there is
    no device memory to free, so its offload points need a GPU.
    """
    measured = str(getattr(chain.transfer_costs, "source", "default")) != "default"
    return str(meta.get("device", "")).startswith("cuda") or measured


def prediction_frame(prediction: Prediction) -> pd.DataFrame:
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


def with_option_columns(frame: pd.DataFrame, prediction: Prediction, chain: Chain) -> pd.DataFrame:
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
