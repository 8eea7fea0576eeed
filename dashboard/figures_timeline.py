"""The memory timeline figure: one iteration's events, stacked by category, downsampled on the server."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.align import align_times
from dashboard.downsample import minmax_indices, visible_slice
from dashboard.figures import CATEGORY_COLORS, PHASE_COLORS, TEMPLATE, byte_axis, module_label, plot_text
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes

#: Points drawn per series by default: smooth in a browser, enough to see every spike at screen width.
DEFAULT_MAX_POINTS = 4000


@dataclass(frozen=True)
class PeakMark:
    """Where an iteration's memory peaked.

    Attributes:
        time_ms: time of the event that reported the peak, since the iteration began.
        peak_bytes: the highest allocated bytes seen (``peak_bytes`` of the events table).
        module: the module that was running.
        phase: forward, backward, optimizer or other.
    """

    time_ms: float
    peak_bytes: int
    module: str
    phase: str


def find_peak(frame: pd.DataFrame) -> PeakMark | None:
    """The event with the highest ``peak_bytes`` of a timeline frame, or ``None`` when it is empty."""
    if frame.empty:
        return None
    position = int(np.argmax(frame["peak_bytes"].to_numpy()))
    row = frame.iloc[position]
    return PeakMark(float(row["time_ms"]), int(row["peak_bytes"]), str(row["module"]), str(row["phase"]))


def phase_spans(frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    """Contiguous runs of one phase as ``(phase, start_ms, end_ms)``, each ending where the next starts."""
    if frame.empty:
        return []
    phase = frame["phase"]
    # Comparing integer codes is much faster than comparing a million strings.
    if isinstance(phase.dtype, pd.CategoricalDtype):
        codes, names = phase.cat.codes.to_numpy(), phase.cat.categories
    else:
        codes, names = pd.factorize(phase)
    times = frame["time_ms"].to_numpy()
    cuts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(codes) - 1]))
    return [(str(names[codes[s]]), float(times[s]), float(times[e])) for s, e in zip(starts, ends)]


def timeline_points(frame: pd.DataFrame, x_range: tuple[float, float] | None,
                    max_points: int = DEFAULT_MAX_POINTS) -> np.ndarray:
    """Row positions to draw for the visible range: min/max per bucket of total allocated bytes."""
    times = frame["time_ms"].to_numpy()
    lo, hi = (None, None) if x_range is None else x_range
    start, stop = visible_slice(times, lo, hi)
    return minmax_indices(frame["allocated_bytes"].to_numpy(), max_points, start, stop)


def point_hover(frame: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """One hover text per drawn event: time, phase, module, the total and each category held, in binary units."""
    times = frame["time_ms"].to_numpy()[rows].tolist()
    phases = frame["phase"].astype(str).to_numpy()[rows].tolist()
    modules = frame["module"].astype(str).to_numpy()[rows].tolist()
    totals = frame["allocated_bytes"].to_numpy()[rows].tolist()
    columns = [(c, frame[c].to_numpy()[rows].tolist()) for c in CATEGORY_COLUMNS]
    texts = []
    for i, (ms, phase, module, total) in enumerate(zip(times, phases, modules, totals)):
        held = "".join(f"<br>  {name} {format_bytes(values[i])}" for name, values in columns if values[i])
        texts.append(f"{ms:.3f} ms, {phase}, {plot_text(module_label(module))}<br>"
                     f"<b>allocated {format_bytes(total)}</b>{held}")
    return texts


def compare_trace(frame: pd.DataFrame, compare: pd.DataFrame, name: str, x_range: tuple[float, float] | None,
                  max_points: int) -> go.Scatter:
    """A second run's allocated memory on the first run's clock (:func:`dashboard.align.align_times`).

    An estimate (or a run at another speed) lasts a different time than the run it is compared with; mapped
    at the events both recorded, their shapes overlay. Its own times are in the hover; a run sharing too
    few events with the first is drawn on its own clock, as the legend says.
    """
    aligned = align_times(compare, frame)
    own = compare["time_ms"].to_numpy()
    times = aligned if aligned is not None else own
    clock = "aligned at shared events" if aligned is not None else "its own clock"
    lo, hi = (None, None) if x_range is None else x_range
    start, stop = visible_slice(times, lo, hi)
    other = minmax_indices(compare["allocated_bytes"].to_numpy(), max_points, start, stop)
    values = compare["allocated_bytes"].to_numpy()[other]
    hover = [f"{plot_text(name)} at {t:.3f} ms of its own: allocated {format_bytes(v)}"
             for t, v in zip(own[other].tolist(), values.tolist())]
    return go.Scatter(x=times[other], y=values, name=f"allocated ({plot_text(name)}, {clock})", mode="lines",
                      line={"color": "#000000", "width": 1.5, "dash": "dot", "shape": "hv"},
                      hovertext=hover, hoverinfo="text")


def timeline_figure(frame: pd.DataFrame, x_range: tuple[float, float] | None = None,
                    max_points: int = DEFAULT_MAX_POINTS, compare: pd.DataFrame | None = None,
                    compare_name: str = "", revision: str = "",
                    peak_at: tuple[str, str] | None = None) -> go.Figure:
    """Allocated memory over one iteration, stacked by category, with phases shaded and the peak marked.

    Args:
        frame: one iteration's events (``time_ms``, ``phase``, ``module``, ``allocated_bytes``,
            ``peak_bytes``, ``reserved_bytes`` and one column per category), in event order.
        x_range: the visible range in ms (after a zoom); the whole iteration when ``None``.
        max_points: the most events drawn per series; the range is min/max-bucketed down to it.
        compare: a second run's timeline frame, drawn as a line of its total allocated bytes.
        compare_name: that run's name.
        revision: plotly ``uirevision``: the zoom is kept while it stays the same.
        peak_at: ``(module, phase)`` the profiler attributed the iteration's peak to (the iterations
            table's ``peak_module``/``peak_phase``, exact to the allocation); otherwise the module of
            the event that reported the peak, which closes the interval the peak happened in.
    """
    fig = go.Figure()
    rows = timeline_points(frame, x_range, max_points) if not frame.empty else np.arange(0)
    x = frame["time_ms"].to_numpy()[rows]
    for column in CATEGORY_COLUMNS:
        values = frame[column].to_numpy()[rows]
        # memory changes at events and holds between them: steps, not ramps; the one hover is the total's
        fig.add_trace(go.Scatter(x=x, y=values, name=column, stackgroup="allocated", mode="lines",
                                 line={"width": 0.5, "color": CATEGORY_COLORS[column], "shape": "hv"},
                                 hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=frame["allocated_bytes"].to_numpy()[rows], name="allocated", mode="lines",
                             line={"width": 0, "shape": "hv", "color": "rgba(0,0,0,0)"}, showlegend=False,
                             hovertext=point_hover(frame, rows), hoverinfo="text"))
    reserved = frame["reserved_bytes"].to_numpy()[rows]
    if reserved.any():  # a device without a caching allocator (CPU) reserves nothing
        fig.add_trace(go.Scatter(x=x, y=reserved, name="reserved", mode="lines", hoverinfo="skip",
                                 line={"color": "#333333", "dash": "dash", "width": 1, "shape": "hv"}))
    if compare is not None and not compare.empty:
        fig.add_trace(compare_trace(frame, compare, compare_name, x_range, max_points))
    labelled: set[str] = set()
    for phase, start, end in phase_spans(frame):
        # Each phase is named once, on its first span, so many short spans do not clutter the top.
        label = {} if phase in labelled or phase == "other" else {
            "annotation_text": phase, "annotation_position": "bottom left",
            "annotation_font": {"size": 11, "color": "#555555"}}
        labelled.add(phase)
        fig.add_vrect(x0=start, x1=end, fillcolor=PHASE_COLORS.get(phase, PHASE_COLORS["other"]),
                      line_width=0, layer="below", **label)
    peak = find_peak(frame)
    if peak is not None:
        module, phase = peak_at if peak_at is not None else (peak.module, peak.phase)
        peak_label = f"peak {format_bytes(peak.peak_bytes)} in {plot_text(module_label(module))} ({phase})"
        fig.add_trace(go.Scatter(x=[peak.time_ms], y=[peak.peak_bytes], mode="markers", name="peak",
                                 marker={"symbol": "x", "size": 11, "color": "#d62728"},
                                 hovertext=[peak_label], hoverinfo="text"))
        fig.add_annotation(x=peak.time_ms, y=peak.peak_bytes, text=peak_label, showarrow=True, arrowhead=2, ay=-30)
    top = max(float(frame["peak_bytes"].max()), float(frame["reserved_bytes"].max())) if not frame.empty else 0.0
    fig.update_layout(title="Memory over one iteration, by category (phases shaded)",
                      xaxis={"title": {"text": "time since the iteration began (ms)"}, "automargin": True},
                      yaxis=byte_axis("allocated memory", top),
                      margin={"l": 70, "r": 20, "t": 50, "b": 40}, height=460, uirevision=revision,
                      hovermode="x", hoverdistance=-1, template=TEMPLATE)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range), autorange=False)
    return fig


def relayout_range(relayout: dict | None) -> tuple[float, float] | None:
    """The x-range a plotly ``relayoutData`` event asks for, or ``None`` for the whole iteration.

    Plotly reports a zoom either as ``xaxis.range[0]``/``xaxis.range[1]`` or as ``xaxis.range``,
    and a reset as ``xaxis.autorange``.
    """
    if not relayout or relayout.get("xaxis.autorange"):
        return None
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        lo, hi = relayout["xaxis.range[0]"], relayout["xaxis.range[1]"]
    elif isinstance(relayout.get("xaxis.range"), (list, tuple)) and len(relayout["xaxis.range"]) == 2:
        lo, hi = relayout["xaxis.range"]
    else:
        return None
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return None
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo >= hi:
        return None
    return lo, hi
