"""Figure builders for the trace views: pure functions from data frames to plotly figures.

Plotly reads a few HTML tags (``<b>``, ``<br>``, ``<a>``) in text, so every module or run name put
into a figure goes through :func:`plot_text`, which escapes it to show as typed.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures_tree import tree_boxes
from memprof.categories import CATEGORY_COLUMNS
from memprof.phases import Phase
from memprof.units import binary_unit, format_bytes

#: One colour per category, the same in every figure.
CATEGORY_COLORS: dict[str, str] = {
    "weights": "#4c78a8",
    "buffers": "#9ecae9",
    "weight_grads": "#f58518",
    "feature_maps": "#54a24b",
    "weight_copies": "#88d27a",  # a lighter feature-map green: copies of weights held around a module's compute
    "grads": "#e45756",
    "optimizer_state": "#b279a2",
    "comm_buffers": "#eeca3b",
    "inputs": "#72b7b2",
    "other": "#bab0ac",
}
CACHE_COLOR = "#dddddd"
PHASE_COLORS: dict[str, str] = {
    Phase.FORWARD.value: "rgba(84, 162, 75, 0.10)",
    Phase.BACKWARD.value: "rgba(228, 87, 86, 0.10)",
    Phase.OPTIMIZER.value: "rgba(178, 121, 162, 0.12)",
    Phase.OTHER.value: "rgba(150, 150, 150, 0.06)",
}
_MARGIN = {"l": 70, "r": 20, "t": 50, "b": 40}
#: plotly.js's own plain look; the same for figures built as dicts (see ``figures_planner``).
TEMPLATE = "none"


def byte_ticks(top_bytes: float, ticks: int = 6, bottom_bytes: float = 0.0) -> dict[str, Any]:
    """Axis ticks in binary units (``0, 16 MiB, 32 MiB ...``) from ``bottom_bytes`` up to ``top_bytes``.

    Plotly would label bytes with decimal prefixes (``60M``) where every number on the page is in
    KiB/MiB/GiB; these ticks say the same unit as the text beside the figure. ``bottom_bytes`` spaces them
    over a window that does not start at 0 (e.g. whole-step budgets from 3.1 GiB to 3.4 GiB), so that
    some fall inside it.
    """
    if not math.isfinite(top_bytes) or top_bytes <= 0:
        return {}
    bottom = float(bottom_bytes) if math.isfinite(bottom_bytes) and 0 < bottom_bytes < top_bytes else 0.0
    name, unit = binary_unit(top_bytes)
    raw = (top_bytes - bottom) / unit / ticks
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if unit == 1:
        step = max(1, round(step))
    start = math.floor(bottom / (step * unit)) * step * unit
    values = np.arange(start, top_bytes + step * unit, step * unit)
    return {"tickmode": "array", "tickvals": values.tolist(),
            "ticktext": ["0" if v == 0 else f"{v / unit:g} {name}" for v in values]}


def byte_axis(title: str, top_bytes: float, bottom_bytes: float = 0.0, ticks: int = 6) -> dict[str, Any]:
    """A memory axis in one binary unit: the title names it (``"peak allocated (MiB)"``), the ticks are numbers.

    The unit is the one :func:`memprof.units.format_bytes` writes the axis's top in, so the axis, its hover and
    the text beside the figure say the same unit; ``automargin`` keeps the title clear of the tick labels.
    """
    valid = math.isfinite(top_bytes) and top_bytes > 0
    name, unit = binary_unit(top_bytes) if valid else ("B", 1)
    axis: dict[str, Any] = {"title": {"text": f"{title} ({name})", "standoff": 10}, "automargin": True}
    ticked = byte_ticks(top_bytes, ticks, bottom_bytes)
    if ticked:
        ticked["ticktext"] = ["0" if v == 0 else f"{v / unit:g}" for v in ticked["tickvals"]]
        axis.update(ticked)
    return axis


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def bytes_texts(values: Sequence[float] | np.ndarray) -> list[str]:
    """:func:`memprof.units.format_bytes` of many sizes at once (the same texts, about ten times faster).

    Figures redrawn on every move of the budget slider label hundreds of points; this keeps them in budget.
    """
    sizes = np.asarray(values, dtype=float)
    if sizes.size == 0:
        return []
    magnitude = np.abs(sizes)
    power = np.zeros(sizes.shape, dtype=int)
    for _ in range(len(_UNITS) - 1):  # the largest unit not above each size, as binary_unit picks it
        power += (magnitude / 1024.0**power >= 1024) & (power < len(_UNITS) - 1)
    scaled = magnitude / 1024.0**power
    texts = []
    for size, value, p in zip(sizes.tolist(), scaled.tolist(), power.tolist()):
        sign = "-" if size < 0 else ""
        texts.append(f"{sign}{int(round(value))} B" if p == 0 else f"{sign}{value:.1f} {_UNITS[p]}")
    return texts


def iteration_axis(iterations: Sequence[int] | np.ndarray) -> dict[str, Any]:
    """An x axis of whole iterations: ticks on integers only, about ten of them at most."""
    values = np.asarray(iterations)
    span = int(values.max() - values.min()) if values.size else 0
    return {"title": "iteration", "tickformat": "d", "tick0": 0, "dtick": max(1, math.ceil(span / 10))}


def plot_text(name: object) -> str:
    """Escapes a name for plotly text so that markup in it is shown, never interpreted."""
    return str(name).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def module_label(module: str) -> str:
    """The display label of a qualified module name (the root module has the empty name)."""
    return module if module else "(model)"


def empty_figure(message: str) -> go.Figure:
    """A blank figure carrying a message, for views with nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=plot_text(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis={"visible": False}, yaxis={"visible": False}, margin=_MARGIN, height=300,
                      template=TEMPLATE)
    return fig


#: Above this many points a rank's line is drawn without markers.
RANK_MARKERS_MAX_POINTS = 200


def rank_peaks_figure(peaks: pd.DataFrame, highlight_rank: int | None = None, decimated: bool = False) -> go.Figure:
    """Peak allocated bytes over iterations, one line per rank of a distributed run.

    Args:
        peaks: ``rank``, ``iteration``, ``peak_allocated_bytes`` (see :func:`memprof.trace.ranks.rank_peaks`).
        highlight_rank: drawn thicker (the rank that peaks highest).
        decimated: each point is the highest peak of a stretch of iterations (said in the title).
    """
    fig = go.Figure()
    top = float(peaks["peak_allocated_bytes"].max()) if len(peaks) else 0.0
    for rank, frame in peaks.groupby("rank", sort=True):
        values = frame["peak_allocated_bytes"].to_numpy()
        fig.add_trace(go.Scatter(
            x=frame["iteration"].to_numpy(), y=values, name=f"rank {int(rank)}",
            mode="lines+markers" if len(values) <= RANK_MARKERS_MAX_POINTS else "lines",
            line={"width": 4 if rank == highlight_rank else 1.5}, customdata=[format_bytes(v) for v in values],
            hovertemplate=f"rank {int(rank)}, " + "iteration %{x}: %{customdata}<extra></extra>"))
    title = "Peak allocated per iteration, by rank"
    if decimated:
        title += " (each point: the highest of its stretch of iterations)"
    fig.update_layout(title=title, xaxis=iteration_axis(peaks["iteration"]),
                      yaxis={"rangemode": "tozero", **byte_axis("peak allocated", top)}, margin=_MARGIN,
                      height=340, legend={"orientation": "h", "y": -0.2}, template=TEMPLATE)
    return fig


def headline(iterations: pd.DataFrame, costing: Collection[int] = ()) -> str:
    """One sentence: the peak, where it happened, what dominates it and how much is cache.

    Args:
        iterations: the run's iterations table.
        costing: iterations the peak is never taken from (a compiled run's costing iterations,
            ``memprof.schema.not_headlining``), unless every iteration is one.
    """
    if iterations.empty:
        return "This run has no recorded iterations yet."
    pool = iterations[~iterations["iteration"].isin(list(costing))]
    pool = pool if len(pool) else iterations
    row = pool.loc[pool["peak_allocated_bytes"].idxmax()]
    peak = int(row["peak_allocated_bytes"])
    shares = {c: int(row[c]) for c in CATEGORY_COLUMNS}
    top = max(shares, key=lambda c: shares[c])
    share = shares[top] / peak if peak else 0.0
    where = ""
    if "peak_module" in row.index and isinstance(row.get("peak_module"), str):
        where = f" during {row.get('peak_phase', '')} in {module_label(row['peak_module'])}"
    reserved = int(row["peak_reserved_bytes"])
    cache = max(reserved - peak, 0)
    cache_text = (f"allocator cache {format_bytes(cache)} ({cache / reserved:.0%} of {format_bytes(reserved)} reserved)"
                  if reserved else "no allocator cache on this device")
    return (f"Peak {format_bytes(peak)} allocated at iteration {int(row['iteration'])}{where}; "
            f"{top} dominates with {format_bytes(shares[top])} ({share:.0%}); {cache_text}.")


def layer_tree_figure(layers: pd.DataFrame, column: str, root_label: str = "model") -> go.Figure:
    """Treemap of the module tree of one iteration, each box sized by ``column`` (bytes).

    Args:
        layers: one iteration's rows of the layers table (``module``, ``parent``, ``depth``, ``kind``
            and ``column``).
        column: the byte column that sizes the boxes, e.g. ``"weight_bytes"``.
        root_label: the label of the root module (the model's class name).
    """
    if layers.empty:
        return empty_figure("no modules recorded in this iteration")
    kinds = dict(zip(layers["module"], layers["kind"]))
    ids, parents, labels, sizes, texts = [], [], [], [], []
    for box in tree_boxes(layers, column):
        name = plot_text(module_label(box.module) if box.module else root_label)
        ids.append(box.id)
        parents.append(box.parent)
        sizes.append(box.value_bytes)
        if box.own:
            labels.append("(own)")
            texts.append(f"{name}: {format_bytes(box.value_bytes)} held by the module itself, in none of its children")
            continue
        labels.append(plot_text(box.module.rsplit(".", 1)[-1]) if box.module else plot_text(root_label))
        kind = f" ({plot_text(kinds[box.module])})" if box.module in kinds else ""
        text = f"{name}{kind}: {format_bytes(box.value_bytes)}"
        if box.shared_bytes:
            text += f" (+ {format_bytes(box.shared_bytes)} shared with an earlier module and counted there)"
        texts.append(text)
    fig = go.Figure(go.Treemap(ids=ids, parents=parents, labels=labels, values=sizes, branchvalues="total",
                               hovertext=texts, hoverinfo="text", textinfo="label"))
    fig.update_layout(title=f"Module tree sized by {column}", margin=_MARGIN, height=480, template=TEMPLATE)
    return fig
