"""Figure builders for the Planner view: pure functions from data frames to plotly figures.

These figures are redrawn on every move of the budget slider, whose server time must stay under
150 ms on a 100-stage chain. Building ``plotly.graph_objects`` validates every property and costs
more than that, so these builders return the figure in plotly's JSON form (``{"data": [...],
"layout": {...}}``), which ``dcc.Graph`` takes as is; ``go.Figure(fig)`` validates it (the tests do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dashboard.figures import byte_axis, bytes_texts, plot_text
from memprof.units import format_bytes

OP_COLORS: dict[str, str] = {"F_all": "#54a24b", "F_ck": "#4c78a8", "F_none": "#bab0ac", "B": "#e45756",
                             "OFFLOAD": "#9d755d", "PREFETCH": "#eeca3b"}
#: Operations that copy on a side stream: drawn over their stage's row as thinner, translucent bars (their
#: copy's span), so the overlap with the computation shows.
TRANSFER_KINDS = ("OFFLOAD", "PREFETCH")
ALGORITHM_COLORS: dict[str, str] = {
    "store_all": "#333333", "periodic": "#f58518", "sqrt": "#b279a2", "revolve": "#72b7b2",
    "rotor": "#4c78a8", "rotor_optimal": "#54a24b", "binomial": "#ff9da6", "offload": "#9d755d",
    "offload+weights": "#e45756",  # weight streaming (planner.fronts.weight_points)
}
_MARGIN = {"l": 70, "r": 20, "t": 50, "b": 40}
#: Up to this many stages, each row of the schedule figure is labelled with its module name.
MAX_STAGE_LABELS = 40

Figure = dict[str, Any]


def base_layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
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


def memory_labels(prediction: pd.DataFrame, base_bytes: int = 0) -> tuple[list[str], list[str]]:
    """Each operation's memory in binary units: its peak while it runs, and what it leaves live after it.

    ``base_bytes`` (what the step holds beside the chain) is added, so a whole-step figure says whole-step bytes.
    """
    peaks = prediction["peak_bytes"].to_numpy(dtype=np.int64) + base_bytes
    after = prediction["memory_bytes"].to_numpy(dtype=np.int64) + base_bytes
    return bytes_texts(peaks), bytes_texts(after)


#: The memory part of an operation's hover (customdata[1] and [2] are :func:`memory_labels`).
MEMORY_HOVER = "<br>memory: up to %{customdata[1]} while it runs, %{customdata[2]} after"


def schedule_figure(prediction: pd.DataFrame, stage_names: Sequence[str], base_bytes: int = 0) -> Figure:
    """The schedule's operations as bars on a time axis, one row per stage; each bar's hover says its memory.

    Args:
        prediction: the simulator's frame (``kind``, ``stage``, ``start_ms``, ``end_ms``, ``peak_bytes``,
            ``memory_bytes``); an ``OFFLOAD`` or ``PREFETCH`` row spans its copy, drawn thinner over its stage's row.
        stage_names: labels of stages 1..L (the loss, stage L+1, is labelled ``loss``).
        base_bytes: what the step holds beside the chain, added to the memory in the hover.
    """
    labels = [*(plot_text(n) for n in stage_names), "loss"]
    kinds = prediction["kind"].astype(str).to_numpy()
    peaks, after = memory_labels(prediction, base_bytes)
    data = []
    for kind, color in OP_COLORS.items():
        chosen = kinds == kind
        if not chosen.any():
            continue
        start = prediction["start_ms"].to_numpy(dtype=float)[chosen]
        stage = prediction["stage"].to_numpy(dtype=int)[chosen]
        rows = np.flatnonzero(chosen)
        copy = "copy " if kind in TRANSFER_KINDS else ""
        bar: dict[str, Any] = {
            "type": "bar", "orientation": "h", "name": kind, "y": stage, "base": start,
            "x": prediction["end_ms"].to_numpy(dtype=float)[chosen] - start,
            "marker": {"color": color, "line": {"width": 0}},
            "customdata": [[labels[s - 1] if 0 < s <= len(labels) else str(s), peaks[r], after[r]]
                           for s, r in zip(stage, rows)],
            "hovertemplate": (kind + "(%{y}) %{customdata[0]}: " + copy + "%{base:.3f} ms + %{x:.3f} ms"
                              + MEMORY_HOVER + "<extra></extra>"),
        }
        if kind in TRANSFER_KINDS:
            bar.update(width=0.35, opacity=0.75)
        data.append(bar)
    yaxis: dict[str, Any] = {"autorange": "reversed"}
    if len(labels) <= MAX_STAGE_LABELS:
        yaxis.update(tickmode="array", tickvals=list(range(1, len(labels) + 1)),
                     ticktext=[f"{i} {label}" for i, label in enumerate(labels, start=1)])
    layout = base_layout("Schedule: operations over time, one row per stage", "time (ms)", "stage",
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
            (:func:`dashboard.measured.measured_step` or :func:`dashboard.measured.measured_activation`).
        title: the figure title.
        base_bytes: what the step holds beside the chain (``None``: a chain-only figure).
        floor_bytes: the step's peak outside the chain, which no schedule lowers, drawn as a line.
    """
    data, extent = memory_traces(prediction, measured, base_bytes)
    return {"data": data, "layout": memory_layout(extent, budget_bytes, title, floor_bytes)}


@dataclass(frozen=True)
class MemoryExtent:
    """What a memory figure's layout needs to know of its lines (:func:`memory_traces`).

    Attributes:
        top: the highest memory drawn (bytes).
        bottom: the lowest memory drawn on a whole-step figure, 0 on a chain-only one.
        base_bytes: what the step holds beside the chain (``None``: a chain-only figure).
        host_top: the top of the host-memory line (``None``: the schedule offloads nothing).
        aligned: whether measured lines were moved onto the prediction's clock.
    """

    top: float
    bottom: float = 0.0
    base_bytes: int | None = None
    host_top: float | None = None
    aligned: bool = False


def memory_traces(prediction: pd.DataFrame, measured: Sequence[tuple[str, pd.DataFrame]] = (),
                  base_bytes: int | None = None) -> tuple[list[dict[str, Any]], MemoryExtent]:
    """The lines of :func:`memory_figure` (none depends on the budget) and their extent."""
    x, y = predicted_line(prediction)
    if base_bytes is not None:
        y = y + float(base_bytes)
        name = f"predicted (chain + {format_bytes(base_bytes)} beside it)"
    else:
        name = "predicted"
    data = [_memory_trace(x, y, name, {"color": "#4c78a8", "width": 2}, "predicted")]
    host = host_line(prediction)
    if host is not None:
        data.append({**_memory_trace(host[0], host[1], "host memory (offloaded)",
                                     {"color": OP_COLORS["OFFLOAD"], "width": 1.5}, "host"), "yaxis": "y2"})
    for index, (run, frame) in enumerate(measured):
        data.append(_measured_trace(run, frame, MEASURED_COLORS[index % len(MEASURED_COLORS)]))
    drawn = [f for _, f in measured if len(f)]
    top = max([float(np.max(y)) if len(y) else 0.0] + [float(f["memory_bytes"].max()) for f in drawn])
    bottom = 0.0
    if base_bytes is not None and len(y):  # whole-step lines sit far above 0 (the model state): tick what is drawn
        bottom = min([float(np.min(y))] + [float(f["memory_bytes"].min()) for f in drawn])
    aligned = any("measured_ms" in f.columns for _, f in measured)
    return data, MemoryExtent(top, bottom, base_bytes, float(np.max(host[1])) if host is not None else None, aligned)


def memory_layout(extent: MemoryExtent, budget_bytes: int | None = None, title: str = "",
                  floor_bytes: int | None = None) -> dict[str, Any]:
    """The layout of :func:`memory_figure` over lines of ``extent``: its axes, the budget and the floor lines.

    Cheap, so the budget slider's views make one per position (:mod:`dashboard.slider_views`).
    """
    top = max(extent.top, float(budget_bytes or 0), float(floor_bytes or 0))
    if extent.base_bytes is not None:
        default = (f"Predicted memory of the whole training step (the chain's simulated timeline + "
                   f"{format_bytes(extent.base_bytes)} held beside it)")
        y_title = "whole-step memory"
    else:
        default = "Predicted activation memory (budget counts activations, not weights)"
        y_title = "activation memory"
    x_title = "time since the forward began (ms" + (", measured runs aligned to the prediction at each operation)"
                                                     if extent.aligned else ")")
    layout = base_layout(title or default, x_title, "", height=380, legend={"orientation": "h", "y": -0.25},
                         yaxis=byte_axis(y_title, top, bottom_bytes=extent.bottom))
    if extent.host_top is not None:  # its own axis: host memory is not the device's, and may sit far below a whole step
        layout["yaxis2"] = {**byte_axis("host memory", extent.host_top), "overlaying": "y", "side": "right",
                            "showgrid": False, "rangemode": "tozero"}
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
    return layout


#: Colours of the measured runs drawn over a prediction, one per run.
MEASURED_COLORS = ("#e45756", "#f58518", "#54a24b", "#b279a2")


def _memory_trace(x: np.ndarray, y: np.ndarray, name: str, line: dict[str, Any], what: str) -> dict[str, Any]:
    """A memory line drawn as steps (memory changes at events, it does not ramp), its hover in binary units."""
    return {"type": "scatter", "x": x, "y": y, "mode": "lines", "name": name, "line": {**line, "shape": "hv"},
            "customdata": bytes_texts(y),
            "hovertemplate": "%{x:.3f} ms: %{customdata}<extra>" + what + "</extra>"}


def measured_envelope(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A measured line drawn as the prediction is: the highest memory between two events, then what the second
    event leaves (``peak_bytes`` is the allocator's peak since the previous event).

    Returns:
        ``(x, y, row)``: the points (each event but the first twice: its interval's peak, then its memory) and the
        frame row each point comes from.
    """
    times = frame["time_ms"].to_numpy(dtype=float)
    memory = frame["memory_bytes"].to_numpy()
    peaks = frame["peak_bytes"].to_numpy() if "peak_bytes" in frame.columns else memory
    if len(times) < 2:
        return times, memory, np.arange(len(times))
    rows = np.concatenate(([0], np.repeat(np.arange(1, len(times)), 2)))
    x = np.concatenate(([times[0]], np.column_stack([times[:-1], times[1:]]).ravel()))
    y = np.concatenate(([memory[0]], np.column_stack([np.maximum(peaks[1:], memory[1:]), memory[1:]]).ravel()))
    return x, y, rows


def _measured_trace(run: str, frame: pd.DataFrame, color: str) -> dict[str, Any]:
    """A measured run's line (:func:`measured_envelope`); when aligned to the prediction (``measured_ms``: its own
    clock), the hover also says its own time."""
    x, y, rows = measured_envelope(frame)
    trace = _memory_trace(x, y, f"measured ({plot_text(run)})", {"color": color, "width": 1.5, "dash": "dot"},
                          "measured")
    if "measured_ms" in frame.columns:
        own = frame["measured_ms"].to_numpy(dtype=float)[rows]
        trace["customdata"] = [[text, float(ms)] for text, ms in zip(trace["customdata"], own)]
        trace["hovertemplate"] = ("%{x:.3f} ms (measured at %{customdata[1]:.3f} ms): %{customdata[0]}"
                                  "<extra>measured</extra>")
    return trace


def schedule_text(ops: Sequence[object]) -> str:
    """The operations as one line of text, e.g. ``"F_ck(1) F_all(2) B(2) B(1)"``."""
    return " ".join(str(op) for op in ops)
