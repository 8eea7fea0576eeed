"""Figure builders for the Planner view: pure functions from data frames to plotly figures.

These figures are redrawn on every move of the budget slider, whose server time must stay under
150 ms on a 100-stage chain. Building ``plotly.graph_objects`` validates every property and costs
more than that, so these builders return the figure in plotly's JSON form (``{"data": [...],
"layout": {...}}``), which ``dcc.Graph`` takes as is; ``go.Figure(fig)`` validates it (the tests do).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboard.figures import byte_ticks, plot_text
from memprof.units import format_bytes

OP_COLORS: dict[str, str] = {"F_all": "#54a24b", "F_ck": "#4c78a8", "F_none": "#bab0ac", "B": "#e45756",
                             "OFFLOAD": "#9d755d", "PREFETCH": "#eeca3b"}
#: Operations that copy on a side stream: drawn over their stage's row as thinner, translucent bars (their
#: copy's span), so the overlap with the computation shows.
TRANSFER_KINDS = ("OFFLOAD", "PREFETCH")
ALGORITHM_COLORS: dict[str, str] = {
    "store_all": "#333333", "periodic": "#f58518", "sqrt": "#b279a2", "revolve": "#72b7b2",
    "rotor": "#4c78a8", "rotor_optimal": "#54a24b", "binomial": "#ff9da6", "offload": "#9d755d",
    "offload+weights": "#e45756",  # weight streaming (planner.weight_points)
}
_MARGIN = {"l": 70, "r": 20, "t": 50, "b": 40}
#: Up to this many stages, each row of the schedule figure is labelled with its module name.
MAX_STAGE_LABELS = 40

Figure = dict[str, Any]


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {"title": {"text": title}, "xaxis": {"title": {"text": x_title}},
                              "yaxis": {"title": {"text": y_title}}, "margin": dict(_MARGIN),
                              "paper_bgcolor": "white", "plot_bgcolor": "white"}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _hline(y: float, text: str) -> tuple[dict, dict]:
    shape = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
             "line": {"color": "#999999", "dash": "dash"}}
    note = {"xref": "paper", "x": 0, "yref": "y", "y": y, "text": text, "showarrow": False,
            "xanchor": "left", "yanchor": "bottom"}
    return shape, note


def schedule_figure(prediction: pd.DataFrame, stage_names: Sequence[str]) -> Figure:
    """The schedule's operations as bars on a time axis, one row per stage.

    Args:
        prediction: the simulator's frame (``kind``, ``stage``, ``start_ms``, ``end_ms``); an ``OFFLOAD`` or
            ``PREFETCH`` row spans its copy, drawn thinner over the row of its stage.
        stage_names: labels of stages 1..L (the loss, stage L+1, is labelled ``loss``).
    """
    labels = [*(plot_text(n) for n in stage_names), "loss"]
    kinds = prediction["kind"].astype(str).to_numpy()
    data = []
    for kind, color in OP_COLORS.items():
        chosen = kinds == kind
        if not chosen.any():
            continue
        start = prediction["start_ms"].to_numpy(dtype=float)[chosen]
        stage = prediction["stage"].to_numpy(dtype=int)[chosen]
        bar: dict[str, Any] = {
            "type": "bar", "orientation": "h", "name": kind, "y": stage, "base": start,
            "x": prediction["end_ms"].to_numpy(dtype=float)[chosen] - start,
            "marker": {"color": color, "line": {"width": 0}},
            "customdata": [labels[s - 1] if 0 < s <= len(labels) else str(s) for s in stage],
            "hovertemplate": kind + "(%{y}) %{customdata}: %{base:.3f} ms + %{x:.3f} ms<extra></extra>",
        }
        if kind in TRANSFER_KINDS:
            bar.update(width=0.35, opacity=0.75)
            bar["hovertemplate"] = kind + "(%{y}) %{customdata}: copy %{base:.3f} ms + %{x:.3f} ms<extra></extra>"
        data.append(bar)
    yaxis: dict[str, Any] = {"autorange": "reversed"}
    if len(labels) <= MAX_STAGE_LABELS:
        yaxis.update(tickmode="array", tickvals=list(range(1, len(labels) + 1)),
                     ticktext=[f"{i} {label}" for i, label in enumerate(labels, start=1)])
    layout = _layout("Schedule: operations over time, one row per stage", "time (ms)", "stage",
                     barmode="overlay", bargap=0.15, yaxis=yaxis, height=max(300, 60 + 22 * len(labels)),
                     margin={"l": 160})
    return {"data": data, "layout": layout}


def _computations(prediction: pd.DataFrame) -> pd.DataFrame:
    """The rows of operations on the compute stream (a frame without ``stream`` has nothing else)."""
    if "stream" not in prediction.columns:
        return prediction
    return prediction[prediction["stream"].to_numpy() == "compute"]


def predicted_line(prediction: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The predicted memory as a line: each operation's peak while it runs, then what it leaves live.

    Copies (``OFFLOAD``, ``PREFETCH``) are left out: what they change on the device shows in the memory of
    the computations around them.
    """
    prediction = _computations(prediction)
    start = prediction["start_ms"].to_numpy(dtype=float)
    end = prediction["end_ms"].to_numpy(dtype=float)
    peak = prediction["peak_bytes"].to_numpy(dtype=float)
    after = prediction["memory_bytes"].to_numpy(dtype=float)
    x = np.column_stack([start, end, end]).ravel()
    y = np.column_stack([peak, peak, after]).ravel()
    return x, y


def host_line(prediction: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Host memory held by offloaded activations over time (a step line), or ``None`` when nothing is offloaded.

    It rises when an ``OFFLOAD`` is issued and falls when its ``PREFETCH`` is retired, i.e. after the operation
    during which the copy back ran; plotted at each operation's start, it steps at the right operations.
    """
    if "host_bytes" not in prediction.columns or not (prediction["host_bytes"].to_numpy() > 0).any():
        return None
    start = prediction["start_ms"].to_numpy(dtype=float)
    order = np.argsort(start, kind="stable")
    return start[order], prediction["host_bytes"].to_numpy(dtype=float)[order]


def memory_figure(prediction: pd.DataFrame, budget_bytes: int | None = None,
                  measured: Sequence[tuple[str, pd.DataFrame]] = (), title: str = "",
                  base_bytes: int | None = None, floor_bytes: int | None = None) -> Figure:
    """Predicted memory of a schedule, with measured runs of it drawn over it.

    With ``base_bytes`` (a chain with step costs) the figure is the whole training step's memory: the
    predicted line is the simulator's chain timeline plus ``base_bytes`` (what the step holds beside the
    chain), and the measured lines are the allocator's whole-step memory. Without it, both are the chain's
    activation memory.

    A schedule that offloads also shows the host memory its offloaded activations hold (``host_bytes``),
    beside the device's.

    Args:
        prediction: the simulator's frame (``start_ms``, ``end_ms``, ``memory_bytes``, ``peak_bytes``, and
            ``stream`` and ``host_bytes`` when it has transfers).
        budget_bytes: the budget, drawn as a horizontal line.
        measured: ``(run name, frame)`` pairs with ``time_ms`` and ``memory_bytes``
            (:func:`dashboard.planning.measured_step` or :func:`dashboard.planning.measured_activation`).
        title: the figure title.
        base_bytes: what the step holds beside the chain (``None``: a chain-only figure).
        floor_bytes: the step's peak outside the chain, which no schedule lowers, drawn as a line.
    """
    x, y = predicted_line(prediction)
    whole_step = base_bytes is not None
    if base_bytes is not None:
        y = y + float(base_bytes)
        name = f"predicted (chain + {format_bytes(base_bytes)} beside it)"
    else:
        name = "predicted"
    data = [{"type": "scatter", "x": x, "y": y, "mode": "lines", "name": name,
             "line": {"color": "#4c78a8", "width": 2},
             "hovertemplate": "%{x:.3f} ms: %{y:,.0f} B<extra>predicted</extra>"}]
    host = host_line(prediction)
    if host is not None:
        data.append({"type": "scatter", "x": host[0], "y": host[1], "mode": "lines", "name": "host memory (offloaded)",
                     "line": {"color": OP_COLORS["OFFLOAD"], "width": 1.5, "shape": "hv"}, "yaxis": "y2",
                     "hovertemplate": "%{x:.3f} ms: %{y:,.0f} B<extra>host</extra>"})
    for run, frame in measured:
        data.append({"type": "scatter", "x": frame["time_ms"].to_numpy(), "y": frame["memory_bytes"].to_numpy(),
                     "mode": "lines", "name": f"measured ({plot_text(run)})",
                     "line": {"color": "#e45756", "width": 1.5, "dash": "dot"},
                     "hovertemplate": "%{x:.3f} ms: %{y:,.0f} B<extra>measured</extra>"})
    top = max([float(np.max(y)) if len(y) else 0.0, float(budget_bytes or 0), float(floor_bytes or 0)]
              + [float(f["memory_bytes"].max()) for _, f in measured if len(f)])
    bottom = 0.0
    if whole_step and len(y):  # whole-step lines sit far above 0 (the model state): tick what is drawn
        bottom = min([float(np.min(y))] + [float(f["memory_bytes"].min()) for _, f in measured if len(f)])
    if base_bytes is not None:
        default = (f"Predicted memory of the whole training step (the chain's simulated timeline + "
                   f"{format_bytes(base_bytes)} held beside it)")
        y_title = "whole-step memory (bytes)"
    else:
        default = "Predicted activation memory (budget counts activations, not weights)"
        y_title = "activation memory (bytes)"
    layout = _layout(title or default, "time since the forward began (ms)", y_title, height=380,
                     legend={"orientation": "h", "y": -0.25}, yaxis=byte_ticks(top, bottom_bytes=bottom))
    if host is not None:  # its own axis: host memory is not the device's, and may sit far below a whole step
        layout["yaxis2"] = {**byte_ticks(float(np.max(host[1]))), "title": {"text": "host memory (bytes)"},
                            "overlaying": "y", "side": "right", "showgrid": False, "rangemode": "tozero"}
        layout["margin"] = {**layout["margin"], "r": 70}
    shapes, notes = [], []
    if budget_bytes is not None:
        shape, note = _hline(budget_bytes, f"budget {format_bytes(budget_bytes)}")
        shapes.append(shape)
        notes.append(note)
    if floor_bytes is not None:
        shape, note = _hline(floor_bytes, f"step peak outside the chain: {format_bytes(floor_bytes)} "
                                          "(no schedule's peak goes below)")
        shape["line"] = {"color": "#bbbbbb", "dash": "dot"}
        shapes.append(shape)
        notes.append(note)
    if shapes:
        layout.update(shapes=shapes, annotations=notes)
    return {"data": data, "layout": layout}


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
             "hovertemplate": "budget %{x:,.0f} B: %{y:.3f} ms<extra>optimal</extra>"}]
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
    title, x_title = (("Whole-step memory vs time of every algorithm", "whole-step peak memory (bytes)")
                      if whole_step else ("Memory vs time of every algorithm", "activation memory (bytes)"))
    return {"data": data, "layout": _layout(title, x_title, "makespan (ms)", height=380, xaxis=byte_ticks(top, bottom_bytes=bottom))}


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

    ``base`` is not modified (it is cached and shared), only its top-level lists are copied.
    """
    data = list(base["data"])
    layout = dict(base["layout"])
    if budget_bytes is not None:
        layout["shapes"] = [{"type": "line", "yref": "paper", "y0": 0, "y1": 1, "xref": "x", "x0": budget_bytes,
                             "x1": budget_bytes, "line": {"color": "#999999", "dash": "dash"}}]
    if current is not None:
        data.append({"type": "scatter", "x": [current[0]], "y": [current[1]], "mode": "markers",
                     "name": "this schedule", "marker": {"symbol": "star", "size": 16, "color": "#d62728"},
                     "hovertemplate": "peak %{x:,.0f} B: %{y:.3f} ms<extra>this schedule</extra>"})
    return {"data": data, "layout": layout}


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


def schedule_text(ops: Sequence[object]) -> str:
    """The operations as one line of text, e.g. ``"F_ck(1) F_all(2) B(2) B(1)"``."""
    return " ".join(str(op) for op in ops)
