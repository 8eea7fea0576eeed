"""The Planner's Pareto figure: every algorithm's memory against time, the optimal front, the current schedule.

Plotly's JSON form, as :mod:`dashboard.figures_planner`. The figure's traces are built once per chain and cached
(:func:`pareto_base`, named by :func:`with_data_revision`); the slider moves only the current schedule's star and
the budget line, layout items that the browser redraws without the traces (:func:`with_current`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboard.figures import byte_axis, plot_text
from dashboard.figures_planner import ALGORITHM_COLORS, Figure, base_layout
from memprof.units import format_bytes

#: The current schedule on the Pareto figure: a star drawn as an annotation, and its legend entry.
STAR, CURRENT_COLOR = "\u2605", "#d62728"
CURRENT_LEGEND: dict[str, Any] = {"type": "scatter", "x": [None], "y": [None], "mode": "markers",
                                  "name": "this schedule", "marker": {"symbol": "star", "size": 14, "color": CURRENT_COLOR},
                                  "hoverinfo": "skip"}


def pareto_base(points: pd.DataFrame, front_budgets: Sequence[float] | np.ndarray,
                front_makespans: Sequence[float] | np.ndarray,
                whole_step: bool = False) -> Figure:
    """Memory against time of every algorithm and the optimal front (what does not move with the slider).

    Args:
        points: ``planner.algorithm_points``: algorithm, budget_bytes, peak_bytes, makespan_ms.
        front_budgets: the Pareto front's budgets (bytes).
        front_makespans: the optimal makespan at each of those budgets (ms).
        whole_step: whether the bytes are the whole training step's (a chain with step costs) rather than
            the chain's activation memory.
    """
    data = [{"type": "scatter", "x": np.asarray(front_budgets), "y": np.asarray(front_makespans), "mode": "lines",
             "name": "rotor optimum by budget", "line": {"shape": "hv", "color": ALGORITHM_COLORS["rotor"], "width": 1},
             "customdata": [format_bytes(b) for b in np.asarray(front_budgets).tolist()],
             "hovertemplate": "budget %{customdata}: %{y:.3f} ms<extra>optimal</extra>"}]
    for algorithm, group in points.groupby("algorithm", sort=False):
        group = group.sort_values("peak_bytes")
        name = plot_text(algorithm)
        data.append({"type": "scatter", "x": group["peak_bytes"].to_numpy(), "y": group["makespan_ms"].to_numpy(),
                     "mode": "lines+markers", "name": name, "marker": {"size": 7},
                     "line": {"color": ALGORITHM_COLORS.get(str(algorithm), "#888888"), "width": 1, "dash": "dot"},
                     "customdata": _peak_labels(group),
                     "hovertemplate": "peak %{customdata}: %{y:.3f} ms<extra>" + name + "</extra>"})
    top = max([float(np.max(front_budgets)) if len(front_budgets) else 0.0]
              + ([float(points["peak_bytes"].max())] if len(points) else []))
    lows = ([float(np.min(front_budgets))] if len(front_budgets) else []) + (
        [float(points["peak_bytes"].min())] if len(points) else [])
    bottom = min(lows) if whole_step and lows else 0.0  # whole-step peaks sit far above 0
    title, x_title = (("Whole-step memory vs time of every algorithm", "whole-step peak memory")
                      if whole_step else ("Memory vs time of every algorithm", "activation memory"))
    return {"data": data, "layout": base_layout(title, "", "makespan (ms)", height=380,
                                            xaxis=byte_axis(x_title, top, bottom_bytes=bottom))}


def _peak_labels(points: pd.DataFrame) -> list[str]:
    """Each point's peak in binary units, with the host memory beside it where the schedule offloads."""
    labels = []
    for peak, params in zip(points["peak_bytes"], points["params"] if "params" in points else [""] * len(points)):
        host = json.loads(params).get("host_peak_bytes", 0) if isinstance(params, str) and params else 0
        streamed = json.loads(params).get("streamed_weights", []) if isinstance(params, str) and params else []
        weights = f", weights of {len(streamed)} stages streamed" if streamed else ""
        labels.append(format_bytes(peak) + (f" (+ {format_bytes(host)} on the host{weights})" if host else ""))
    return labels


def with_current(base: Figure, current: tuple[float, float] | None = None,
                 budget_bytes: float | None = None) -> Figure:
    """A copy of :func:`pareto_base`'s figure with the budget line and the current schedule's star.

    ``base`` is not modified (it is cached and shared), only its top-level lists are copied. The star and the
    line are layout items (an annotation and a shape), not traces: when the slider moves only they change, so
    with ``base``'s ``datarevision`` (:func:`with_data_revision`) the browser redraws them alone, not the traces.
    """
    data = list(base["data"])
    layout = dict(base["layout"])
    if budget_bytes is not None:
        layout["shapes"] = [*layout.get("shapes", []), {
            "type": "line", "yref": "paper", "y0": 0, "y1": 1, "xref": "x", "x0": budget_bytes, "x1": budget_bytes,
            "line": {"color": "#999999", "dash": "dash"}}]
    if current is not None:
        data.append(CURRENT_LEGEND)
        layout["annotations"] = [*layout.get("annotations", []), {
            "x": current[0], "y": current[1], "xref": "x", "yref": "y", "text": STAR, "showarrow": False,
            "font": {"size": 24, "color": CURRENT_COLOR}, "name": "this schedule",
            "hovertext": f"this schedule: peak {format_bytes(current[0])}, {current[1]:.3f} ms"}]
    return {"data": data, "layout": layout}


def with_data_revision(figure: Figure) -> Figure:
    """``figure`` with a ``datarevision`` that names its data: a browser given the same one again skips the traces.

    Plotly redraws every trace whose arrays are new objects (they always are, from the server) unless the
    layout's ``datarevision`` is unchanged. Computed once for a cached figure; modifies and returns ``figure``.
    """
    digest = hashlib.sha1(json.dumps(figure["data"], sort_keys=True, default=_plain).encode()).hexdigest()[:16]
    figure["layout"] = {**figure["layout"], "datarevision": digest}
    return figure


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else float(value) if isinstance(value, np.floating) \
        else int(value) if isinstance(value, np.integer) else str(value)


def pareto_figure(points: pd.DataFrame, front_budgets: Sequence[float], front_makespans: Sequence[float],
                  current: tuple[float, float] | None = None, budget_bytes: float | None = None,
                  whole_step: bool = False) -> Figure:
    """Memory against time of every algorithm, the optimal front, and the current schedule.

    Args:
        points: ``planner.algorithm_points``: algorithm, budget_bytes, peak_bytes, makespan_ms.
        front_budgets: the Pareto front's budgets (bytes).
        front_makespans: the optimal makespan at each of those budgets (ms).
        current: ``(peak_bytes, makespan_ms)`` of the schedule shown, marked with a star.
        budget_bytes: the slider's budget, drawn as a vertical line.
        whole_step: whether the bytes are the whole training step's.
    """
    return with_current(pareto_base(points, front_budgets, front_makespans, whole_step), current, budget_bytes)
