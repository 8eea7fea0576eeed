"""What the budget slider shows, made once per chain so that the page redraws the Planner without the server.

The slider has ``SLIDER_STEPS + 1`` positions and the front gives each one a schedule, far fewer distinct ones
than positions. :func:`slider_views` makes, once per run and chain, every distinct schedule's view (its
schedule-and-memory figure, its texts, its point on the Pareto figure) and, for every position, what depends
on the budget itself: the budget's text and the layout keys that differ from its schedule's (the budget line
and its note, the memory axis's ticks, the Pareto figure's star and line). ``assets/planner.js`` then shows a
position by picking these apart in the page, so releasing the handle costs no request and the browser redraws
only what changed (the traces of a schedule already drawn are the same objects, so plotly keeps them).

The views hold at most :data:`MAX_VIEW_OPS` operations in all (their size grows with the chain); a position
past that is answered by the server as before (:func:`dashboard.callbacks_planner.planner_view`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

import planner
from dashboard.figures_options import option_summary, schedule_figure_with_options
from dashboard.figures_pareto import with_current
from dashboard.figures_planner import Figure, MemoryExtent, memory_layout, memory_traces, schedule_text
from dashboard.figures_schedule import planner_data, planner_layout
from dashboard.measured import MeasuredRun, same_schedule
from dashboard.planning import SLIDER_STEPS, PlannerModel, prediction_frame, with_option_columns
from memprof.units import format_bytes
from planner.discovery.time_scale import TimeScale
from planner.model.weights import streamed_step

#: The most operations the views of one chain hold, all schedules together (about 0.22 KiB of JSON each): a
#: 50-stage chain's views hold 12,400 (2.8 MiB), a 100-stage chain's 26,200 (5.5 MiB); a 200-stage chain's would
#: hold 54,600, so its positions past the cap are left to the server.
MAX_VIEW_OPS = 40_000

#: What the views hold in the server's memory per operation, about (strings and small arrays): their size for the
#: cache's bound (:class:`dashboard.cache.BoundedCache` counts ``nbytes``).
VIEW_BYTES_PER_OP = 1024


class Views(dict):  # a plain dict to Dash and to JSON
    """The views of one chain, as :func:`slider_views` makes them, with ``nbytes``: about what they hold in memory."""

    nbytes: int = 0


@dataclass(frozen=True)
class ScheduleView:
    """One schedule of the front as the Planner shows it, at any budget that selects it.

    Attributes:
        schedule: the schedule (its ``budget_bytes`` the first budget it was read at).
        frame: the simulator's timeline (:func:`dashboard.planning.prediction_frame`, with the option columns).
        peak_bytes: its predicted peak as the budgets count it (the whole step's when the chain has step costs):
            the Pareto star's x.
        makespan_ms: its predicted makespan: the star's y.
        peak_text, makespan_text, ops_text: the texts beside and below the slider.
        data: the schedule-and-memory figure's traces (:func:`dashboard.figures_schedule.planner_data`).
        schedule_layout: the schedule figure's own layout, which :meth:`layout` puts over the memory's.
        extent: what the memory part of the layout needs of its lines.
        floor_bytes: the step's peak outside the chain (``None``: a chain-only figure).
    """

    schedule: planner.Schedule
    frame: pd.DataFrame
    peak_bytes: int
    makespan_ms: float
    peak_text: str
    makespan_text: str
    ops_text: str
    data: list[dict[str, Any]]
    schedule_layout: dict[str, Any]
    extent: MemoryExtent
    floor_bytes: int | None

    def layout(self, budget_bytes: int) -> dict[str, Any]:
        """The figure's layout with the budget ``budget_bytes`` drawn (the only part that moves with it)."""
        return planner_layout(self.schedule_layout, memory_layout(self.extent, budget_bytes,
                                                                  floor_bytes=self.floor_bytes))

    def figure(self, budget_bytes: int) -> Figure:
        """The schedule and its predicted memory on one time axis, at ``budget_bytes``."""
        return {"data": self.data, "layout": self.layout(budget_bytes)}


def matching(found: Iterable[MeasuredRun | tuple[str, str]], schedule: planner.Schedule,
             whole_step: bool) -> list[MeasuredRun]:
    """The measured runs of ``schedule``'s operations, measured as the same quantity (whole step or activations)."""
    return [c for c in found if isinstance(c, MeasuredRun) and same_schedule(c.schedule, schedule)
            and c.whole_step == whole_step]


def budget_text(model: PlannerModel, budget_bytes: int) -> str:
    """What the budget is, and what it leaves the chain."""
    step = model.step
    if step is None:
        state = model.model_state_bytes
        return (f"budget {format_bytes(budget_bytes)} for activations "
                f"(+ {format_bytes(state)} model state = {format_bytes(budget_bytes + state)} in all)")
    return (f"budget {format_bytes(budget_bytes)} for the whole step ({format_bytes(step.base_bytes)} "
            f"beside the chain leaves it {format_bytes(max(step.chain_budget_bytes(budget_bytes), 0))})")


def schedule_view(model: PlannerModel, schedule: planner.Schedule,
                  measured: Sequence[MeasuredRun] = ()) -> ScheduleView:
    """``schedule`` (from ``model``'s front) simulated and drawn, with ``measured`` runs of it over its prediction."""
    prediction = planner.simulate(model.chain, schedule)
    frame = with_option_columns(prediction_frame(prediction), prediction, model.chain)
    chain_peak, makespan = int(prediction.peak_bytes), float(prediction.makespan_ms)
    step = streamed_step(model.chain, schedule.streamed_weights)  # streamed weights' state is in host memory
    if step is None:
        peak = chain_peak
        peak_text = f"predicted peak {format_bytes(peak)}"
    else:
        peak = step.step_peak_bytes(chain_peak)
        peak_text = f"predicted step peak {format_bytes(peak)} (the chain's own {format_bytes(chain_peak)})"
    makespan_text = (f"predicted makespan {makespan:.3f} ms" + _against_store_all(model, makespan)
                     + time_basis_text(model.chain.source.get("time_scale")))
    if measured:
        compared = [c.comparison for c in measured]
        peak_text += "; measured " + ", ".join(f"{format_bytes(c.measured_peak_bytes)} ({c.peak_error:+.1%})"
                                               for c in compared)
        makespan_text += "; measured " + ", ".join(f"{c.measured_step_ms:.3f} ms ({c.time_error:+.1%})"
                                                   for c in compared)
    base = step.base_bytes if step is not None else None
    memory, extent = memory_traces(frame, [(c.name, c.measured) for c in measured], base_bytes=base)
    drawn = schedule_figure_with_options(frame, model.chain.module_names, base or 0)
    options = option_summary(frame)
    ops_text = schedule_text(schedule.ops) + (f"\n\nrecomputation options:\n{options}" if options else "")
    return ScheduleView(schedule, frame, peak, makespan, peak_text, makespan_text, ops_text,
                        planner_data(drawn["data"], memory), drawn["layout"], extent,
                        step.floor_bytes if step is not None else None)


def _against_store_all(model: PlannerModel, makespan: float) -> str:
    store_all = model.points[model.points["algorithm"] == "store_all"]
    if store_all.empty or float(store_all["makespan_ms"].iloc[0]) <= 0:
        return ""
    base = float(store_all["makespan_ms"].iloc[0])
    return f" ({makespan / base - 1:+.1%} over store-all's {base:.3f} ms)"


def time_basis_text(scale: Mapping[str, Any] | None) -> str:
    """What the layer times the makespan adds up were scaled by (``planner.discovery.time_scale``), or ``""``."""
    found = TimeScale.from_json(scale)
    return "" if found.basis == "none" else "; " + found.describe()


def pareto_at(model: PlannerModel, view: ScheduleView, budget_bytes: int) -> Figure:
    """The Pareto figure with ``view``'s star and the budget line at ``budget_bytes``."""
    return with_current(model.pareto, current=(view.peak_bytes, view.makespan_ms), budget_bytes=budget_bytes)


def slider_budgets(model: PlannerModel) -> list[int]:
    """The budget at each slider position, from the minimum feasible (position 0) to store-all.

    Integer steps of ``(max - min) / SLIDER_STEPS`` rounded down, so the middle position is
    :func:`dashboard.planning.default_budget`, where the slider starts; one position when store-all is the minimum.
    """
    low, high = model.min_budget_bytes, model.max_budget_bytes
    if high <= low:
        return [low]
    return [low + (k * (high - low)) // SLIDER_STEPS for k in range(SLIDER_STEPS + 1)]


def _changed(layout: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of ``layout`` whose values differ from ``base``'s (both have the same keys)."""
    return {key: value for key, value in layout.items() if base.get(key) != value}


def slider_views(model: PlannerModel, found: Sequence[MeasuredRun | tuple[str, str]], run: str,
                 choice: str | None, container: str | None, max_ops: int = MAX_VIEW_OPS) -> Views:
    """Everything ``assets/planner.js`` needs to show any slider position of ``model``'s chain without the server.

    Args:
        model: the run's planner model.
        found: the measured runs of schedules from this run (:func:`dashboard.callbacks_planner.comparisons`).
        run: the run's name; ``choice``: the chain picker's value; ``container``: the container it names
            (the page checks the views are of the run and chain it shows).
        max_ops: the most operations the views hold; a position whose schedule would pass it is ``None``.

    Returns:
        ``{"run", "choice", "container", "min", "step", "budgets", "positions", "schedules", "pareto"}``:
        ``positions[k]`` is ``{"schedule", "budget_text", "figure", "pareto"}`` (the last two: layout keys to
        lay over the schedule's figure and the Pareto figure's) or ``None``; ``schedules[i]`` is
        ``{"figure", "texts"}`` (peak, makespan and operations texts).
    """
    budgets = slider_budgets(model)
    views: list[ScheduleView] = []
    schedules: list[dict[str, Any]] = []
    index: dict[tuple, int] = {}
    positions: list[dict[str, Any] | None] = []
    held = 0
    for budget in budgets:
        schedule = model.front.schedule_at(budget)
        if schedule.ops not in index:
            if held + len(schedule.ops) > max_ops:
                positions.append(None)
                continue
            held += len(schedule.ops)
            index[schedule.ops] = len(views)
            view = schedule_view(model, schedule, matching(found, schedule, model.whole_step))
            views.append(view)
            schedules.append({"figure": view.figure(budget),
                              "texts": [view.peak_text, view.makespan_text, view.ops_text]})
        i = index[schedule.ops]
        pareto = pareto_at(model, views[i], budget)
        positions.append({"schedule": i, "budget_text": budget_text(model, budget),
                          "figure": _changed(views[i].layout(budget), schedules[i]["figure"]["layout"]),
                          "pareto": _changed(pareto["layout"], model.pareto["layout"])})
    step = (budgets[-1] - budgets[0]) / SLIDER_STEPS if len(budgets) > 1 else 0
    pareto = with_current(model.pareto, current=(0, 0))  # its traces: the star's legend entry joins them
    made = Views(run=run, choice=choice, container=container, min=budgets[0], step=step, budgets=budgets,
                 positions=positions, schedules=schedules,
                 pareto={"data": pareto["data"], "layout": model.pareto["layout"]})
    made.nbytes = held * VIEW_BYTES_PER_OP  # counted by the cache's bound
    return made


def snapped_budget(model: PlannerModel, value: float) -> int:
    """The budget of the slider position nearest ``value`` (the page's slider reports ``min + k * step``)."""
    budgets = slider_budgets(model)
    if len(budgets) == 1:
        return budgets[0]
    position = round((float(value) - budgets[0]) * SLIDER_STEPS / (budgets[-1] - budgets[0]))
    return budgets[min(max(position, 0), SLIDER_STEPS)]
