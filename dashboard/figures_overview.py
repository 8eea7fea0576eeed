"""Figures of the Overview tab: peaks per iteration and the categories at each peak, for runs of any length.

A run of 100,000 iterations has 100,000 points per series; a browser draws a few thousand smoothly and
a user sees no more. Every series longer than ``max_points`` is decimated with
:func:`dashboard.downsample.minmax_indices`: the iterations are cut into equal-count stretches and each
stretch's lowest and highest point are kept, so every spike stays visible and the run's highest peak
is always drawn. After decimation the figures hold at most a few thousand points per series, which
SVG draws in milliseconds, so no WebGL trace is needed (and none fails in a browser without a GPU).

The iterations that kept their detail (layers and events rows) are marked on the peaks line: those
are the ones the Layers and Timeline tabs can open.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.downsample import minmax_indices
from dashboard.figures import CACHE_COLOR, CATEGORY_COLORS, TEMPLATE, byte_axis, iteration_axis, plot_text
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes

#: The most points drawn per series of an overview figure.
OVERVIEW_MAX_POINTS = 2_000
#: Up to this many iterations the breakdown is one stacked bar per iteration; above, stacked areas.
BAR_MAX_ITERATIONS = 200
#: Up to this many points a line also shows a marker per iteration.
MARKERS_MAX_POINTS = 200
DETAIL_NAME = "detailed iteration (Layers, Timeline)"
_DETAIL_MARKER = {"symbol": "diamond", "size": 6, "color": "#222222", "opacity": 0.8,
                  "line": {"width": 0.5, "color": "white"}}
#: Drawing order: the reserved line behind the allocated one, the detail markers in front.
_ZORDER = {"peak_reserved_bytes": 0, "peak_allocated_bytes": 1, "detail": 2}
_MARGIN = {"l": 70, "r": 20, "t": 70, "b": 40}  # room for a subtitle
_DECIMATED = " (each point the lowest or highest of its stretch of iterations)"
#: Colours of each run's (allocated, reserved) lines: a compared run is told apart by colour, not by dash alone.
RUN_COLORS: tuple[tuple[str, str], ...] = (("#4c78a8", "#f58518"), ("#d62728", "#9467bd"))


def decimate(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most ``max_points`` values keeping each stretch's lowest and highest (all when they fit)."""
    return minmax_indices(np.asarray(values), max_points) if len(values) > max_points else np.arange(len(values))


def _bytes_hover(values: np.ndarray) -> list[str]:
    return [format_bytes(v) for v in values.tolist()]


def _peak_line(frame: pd.DataFrame, column: str, name: str, color: str, dash: str, max_points: int,
               markers: bool) -> go.Scatter:
    values = frame[column].to_numpy()
    keep = decimate(values, max_points)
    y = values[keep]
    return go.Scatter(x=frame["iteration"].to_numpy()[keep], y=y, name=name,
                      mode="lines+markers" if markers and len(keep) <= MARKERS_MAX_POINTS else "lines",
                      line={"color": color, "dash": dash, "width": 1.5}, zorder=_ZORDER[column],
                      opacity=1.0 if column == "peak_allocated_bytes" else 0.7, customdata=_bytes_hover(y),
                      hovertemplate="iteration %{x}: %{customdata}<extra>" + name + "</extra>")


def detail_markers(iterations: pd.DataFrame, detail: np.ndarray, max_points: int = OVERVIEW_MAX_POINTS) -> go.Scatter:
    """Markers on the peak-allocated line at the detailed iterations (decimated like a line when too many)."""
    rows = iterations[iterations["iteration"].isin(detail)]
    values = rows["peak_allocated_bytes"].to_numpy()
    keep = decimate(values, max_points)
    y = values[keep]
    # smaller where many would hide the line they sit on
    marker = {**_DETAIL_MARKER, "size": _DETAIL_MARKER["size"] if len(keep) <= MARKERS_MAX_POINTS else 4}
    return go.Scatter(x=rows["iteration"].to_numpy()[keep], y=y, name=DETAIL_NAME, mode="markers", marker=marker,
                      zorder=_ZORDER["detail"], customdata=_bytes_hover(y),
                      hovertemplate="iteration %{x}: %{customdata}, has detail<extra></extra>")


def peaks_figure(iterations: pd.DataFrame, compare: pd.DataFrame | None = None, names: Sequence[str] = ("", ""),
                 detail: np.ndarray | None = None, max_points: int = OVERVIEW_MAX_POINTS,
                 costing: Sequence[int] = ()) -> go.Figure:
    """Peak allocated and reserved bytes per iteration, optionally beside a second run's.

    Args:
        iterations: the iterations table (``iteration``, ``peak_allocated_bytes``, ``peak_reserved_bytes``).
        compare: a second run's iterations table, or ``None``.
        names: the two runs' names, used in the legend when comparing.
        detail: the first run's detailed iterations; marked when some, not all, iterations have detail.
        max_points: the most points per series (see :func:`decimate`).
        costing: a compiled run's costing iterations (``memprof.schema.costing_iterations``), marked apart: they
            ran block by block (or eagerly) for the layers, not as the compiled model runs.
    """
    fig = go.Figure()
    top = 0.0
    every = detail is None or len(detail) >= len(iterations)
    runs = ((iterations, names[0], "solid"), (compare, names[1] if len(names) > 1 else "", "dot"))
    for (frame, run, dash), colors in zip(runs, RUN_COLORS):
        if frame is None:
            continue
        suffix = f" ({plot_text(run)})" if compare is not None else ""
        for (column, label), color in zip((("peak_allocated_bytes", "peak allocated"),
                                           ("peak_reserved_bytes", "peak reserved")), colors):
            if column == "peak_reserved_bytes" and not frame[column].any():
                continue  # no caching allocator (CPU): nothing reserved to show
            top = max(top, float(frame[column].max()) if len(frame) else 0.0)
            # markers on every point only where every point can be opened; else only the detailed are marked
            fig.add_trace(_peak_line(frame, column, label + suffix, color, dash, max_points, every))
    if not every and detail is not None and len(detail):
        fig.add_trace(detail_markers(iterations, detail, max_points))
    if len(costing):
        fig.add_trace(_costing_markers(iterations, costing))
    title = "Peak memory per iteration"
    if len(iterations) > max_points or (compare is not None and len(compare) > max_points):
        title += f"<br><sup>{len(iterations):,} iterations{_DECIMATED}</sup>"
    fig.update_layout(title=title, xaxis=iteration_axis(iterations["iteration"]),
                      yaxis={"rangemode": "tozero", **byte_axis("peak memory", top)}, margin=_MARGIN,
                      height=360, legend={"orientation": "h", "y": -0.2}, template=TEMPLATE, clickmode="event")
    return fig


def _costing_markers(iterations: pd.DataFrame, costing: Sequence[int]) -> go.Scatter:
    """Open markers on a compiled run's costing iterations, which never headline it."""
    rows = iterations[iterations.iteration.isin(list(costing))]
    return go.Scatter(x=rows.iteration, y=rows.peak_allocated_bytes, mode="markers", name="costing iteration",
                      marker={"symbol": "diamond-open", "size": 11, "color": "#444"},
                      hovertemplate="iteration %{x}: a costing iteration (blocks compiled one by one for the "
                                    "layers), not the compiled model as it runs<extra></extra>")


def breakdown_figure(iterations: pd.DataFrame, max_points: int = OVERVIEW_MAX_POINTS) -> go.Figure:
    """Bytes of each category at each iteration's peak, stacked, with the allocator's cache on top.

    One bar per iteration up to :data:`BAR_MAX_ITERATIONS` iterations; beyond, stacked areas over the
    iterations :func:`decimate` keeps of the stack's total, the same for every category so the stack
    still sums to the total at every drawn point.
    """
    fig = go.Figure()
    x = iterations["iteration"].to_numpy()
    stack = {column: iterations[column].to_numpy() for column in CATEGORY_COLUMNS}
    cache = np.clip(iterations["peak_reserved_bytes"].to_numpy() - iterations["peak_allocated_bytes"].to_numpy(),
                    0, None)
    if cache.any():
        stack["cache (reserved, unallocated)"] = cache
    total = np.sum(list(stack.values()), axis=0) if len(x) else np.zeros(0)
    bars = len(x) <= BAR_MAX_ITERATIONS
    keep = np.arange(len(x)) if bars else decimate(total, max_points)
    for name, values in stack.items():
        y = values[keep]
        color = CATEGORY_COLORS.get(name, CACHE_COLOR)
        short = "cache" if name not in CATEGORY_COLORS else name
        hover = "iteration %{x}: %{customdata}<extra>" + short + "</extra>"
        if bars:
            fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=color, customdata=_bytes_hover(y),
                                 hovertemplate=hover))
        else:
            fig.add_trace(go.Scatter(x=x[keep], y=y, name=name, mode="lines", stackgroup="peak", line={"width": 0.5,
                                     "color": color}, fillcolor=color, customdata=_bytes_hover(y), hovertemplate=hover))
    title = "What the memory held at each iteration's peak"
    if not bars and len(keep) < len(x):
        title += f"<br><sup>{len(x):,} iterations{_DECIMATED}</sup>"
    top = float(total.max()) if len(x) else 0.0
    fig.update_layout(barmode="stack", title=title, xaxis=iteration_axis(x),
                      yaxis=byte_axis("memory at the peak", top), margin=_MARGIN, height=380, template=TEMPLATE)
    return fig
