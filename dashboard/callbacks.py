"""Callbacks of the trace views (Runs, Overview, Layers, Timeline) and their registration.

Each callback's body is a plain function of a :class:`TraceStore` and the callback's inputs, so tests
call it directly; :func:`register` only wires them to component ids. Run names arrive from the
browser and are resolved by the store, which refuses any name outside the traces folder.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import dash
import plotly.graph_objects as go
from dash import Input, Output, State

from dashboard import drilldown, ids, live
from dashboard.data import VIEW_ERRORS, TraceStore, plain_message
from dashboard.estimates import estimate_vs_measured, is_estimate
from dashboard.figures import (
    empty_figure,
    headline,
    layer_tree_figure,
    rank_peaks_figure,
)
from dashboard.figures_overview import breakdown_figure, peaks_figure
from dashboard.figures_timeline import DEFAULT_MAX_POINTS, relayout_range, timeline_figure
from dashboard.layout import LAYER_TABLE_COLUMNS, TREE_SIZES, first_trace_help
from dashboard.pickers import detail_note, iteration_options, keep_open, nearest_detailed
from dashboard.runs import group_runs
from dashboard.tables import layer_rows
from memprof.analysis import format_failure
from memprof.schema import costing_iterations, not_headlining
from memprof.trace import Trace, peak_imbalance
from memprof.trace.ranks import RankImbalance, RankScan
from memprof.units import format_bytes

_NO_RUN = "Choose a run on the Runs tab."


def cannot_read(store: TraceStore, names: list[str], exc: Exception) -> str:
    """The one line a view shows when it cannot read a chosen run: the run's problem line when it has one.

    The same words as above every tab (:meth:`TraceStore.problem`), never a raw exception or an absolute path.
    """
    for name in names[:2]:
        problem = store.problem(name)
        if problem:
            return problem
    return f"Run {' / '.join(names[:2])} cannot be read: {plain_message(str(exc), store.traces_dir)}"


def _no_iteration(store: TraceStore, names: list[str] | None) -> str:
    """What a detail view says when no iteration is open: choose a run, or why the chosen one has none."""
    if not names:
        return _NO_RUN
    return store.problem(names[0]) or f"Run {names[0]} has no iteration with detail (layers and timeline) yet."


def runs_view(store: TraceStore, search: str | None = None) -> tuple[list[dict], list[int], Any, str]:
    """Lists the runs of the folder for the Runs table.

    Args:
        store: the traces.
        search: the page URL's query string; ``?run=NAME`` preselects run NAME.

    Returns:
        The table rows, the selected row indices (the URL's run, else the first readable profiled
        run), the help shown when the folder is empty (else ``None``) and a status message.
    """
    rows = group_runs([store.summary(entry) for entry in store.runs()])  # measured runs under their source
    if not rows:
        return [], [], first_trace_help(str(store.traces_dir)), ""
    wanted = parse_qs((search or "").lstrip("?")).get("run", [None])[0]
    if wanted is not None:
        try:
            store.path(wanted)
        except VIEW_ERRORS as exc:
            return rows, _default_selection(rows), None, f"Refused run {wanted!r} from the address: {exc}"
        matches = [i for i, row in enumerate(rows) if row["name"] == wanted]
        if matches:
            return rows, matches[:1], None, ""
        return rows, _default_selection(rows), None, f"No run named {wanted!r} in the folder."
    return rows, _default_selection(rows), None, ""


def _default_selection(rows: list[dict]) -> list[int]:
    readable = [i for i, row in enumerate(rows) if not row["error"]]
    profiled = [i for i in readable if rows[i]["kind"] == "profiled"]
    return (profiled or readable)[:1]


def selected_names(selected_rows: list[int] | None, rows: list[dict] | None) -> tuple[list[str], str]:
    """The names of the chosen rows (at most two, in the order ticked) and a sentence about them."""
    rows = rows or []
    names = [rows[i]["name"] for i in (selected_rows or []) if 0 <= i < len(rows)][:2]
    if not names:
        return [], "No run chosen."
    if len(names) == 1:
        return names, f"Showing {names[0]}."
    extra = " (only the first two ticked runs are compared)" if len(selected_rows or []) > 2 else ""
    return names, f"Showing {names[0]}, compared with {names[1]}{extra}."


def post_mortem(trace: Trace, failure: dict) -> str:
    """The failed step's post-mortem and the planner's answer, as one paragraph of text."""
    from planner import planner_advice

    lines = [line.strip() for line in format_failure(failure).splitlines() if line.strip()]
    lines += [line.strip() for line in planner_advice(trace, failure)]
    return " | ".join(lines) + " |"


def overview_view(store: TraceStore, names: list[str] | None) -> tuple[str, go.Figure, go.Figure]:
    """The headline, the per-iteration peaks and the breakdown at the peak of the first chosen run."""
    if not names:
        return _NO_RUN, empty_figure(_NO_RUN), empty_figure(_NO_RUN)
    try:
        iterations = store.iterations(names[0])
        compare = store.iterations(names[1]) if len(names) > 1 else None
    except VIEW_ERRORS as exc:
        message = cannot_read(store, names, exc)
        return message, empty_figure(message), empty_figure(message)
    meta = store.meta(names[0])
    text = headline(iterations, not_headlining(meta))
    failure = meta.get("failure")
    if failure:
        # cached: the planner's advice costs a chain, and the overview is drawn on every visit
        advice = store.memo(names[0], "post-mortem", lambda _: post_mortem(store.trace(names[0]), failure))
        text = f"{advice} {text}"
    if compare is not None and not compare.empty and not iterations.empty:
        a, b = int(iterations["peak_allocated_bytes"].max()), int(compare["peak_allocated_bytes"].max())
        text += f" {names[1]} peaks at {b / a:.2f}x of it." if a else ""
        first, second = (is_estimate(store.meta(name)) for name in names[:2])
        if first != second:  # an estimate beside a measured run: how far it was, by category
            pair = (iterations, compare) if first else (compare, iterations)
            text += " " + estimate_vs_measured(*pair)
    detail = store.detail_iterations(names[0])
    return text, peaks_figure(iterations, compare, names, detail, costing=costing_iterations(meta)), \
        breakdown_figure(iterations)


_HIDDEN, _SHOWN = {"display": "none"}, {"display": "block"}


def ranks_view(store: TraceStore, names: list[str] | None) -> tuple[dict, str, go.Figure]:
    """For one rank of a distributed run: every rank's peaks and their imbalance; hidden otherwise."""
    if not names:
        return _HIDDEN, "", empty_figure(_NO_RUN)
    try:
        scan = store.rank_peaks(names[0])
    except VIEW_ERRORS as exc:  # often another rank's problem, not this run's: said as such
        message = f"Cannot compare the ranks of {names[0]}: {plain_message(str(exc), store.traces_dir)}"
        return _SHOWN, message, empty_figure(message)
    if scan is None:
        return _HIDDEN, "", empty_figure("not a distributed run")
    # a damaged part of any rank is left out (memprof.trace.ranks.damaged): one line says which, after the text
    skipped = f" Left out: {plain_message(scan.damage_message, store.traces_dir)}" if scan.damage_message else ""
    imbalance = peak_imbalance(scan.summary)
    if imbalance is None:
        return _SHOWN, "No rank has a complete iteration yet." + skipped, empty_figure("no iterations")
    decimated = len(scan.peaks) < int(scan.summary["iterations"].sum())
    figure = rank_peaks_figure(scan.peaks, imbalance.highest_rank, decimated)
    return _SHOWN, ranks_text(scan, imbalance) + skipped, figure


def ranks_text(scan: RankScan, imbalance: RankImbalance) -> str:
    """The ranks view's sentence: which rank peaks highest, where, and by how much over the lowest."""
    ranks = len(imbalance.peak_by_rank_bytes)
    high, low = imbalance.highest_rank, imbalance.lowest_rank
    top = scan.summary.set_index("rank").loc[high]
    where = f" in {top['peak_module'] or 'no module'} ({top['peak_phase']}, iteration {top['peak_iteration']})"
    missing = len(scan.ranks) - ranks
    waiting = f" {missing} more rank{'s have' if missing > 1 else ' has'} no iteration yet." if missing else ""
    return (f"{ranks} ranks. Rank {high} peaks highest at {format_bytes(imbalance.peak_by_rank_bytes[high])}{where}, "
            f"rank {low} lowest at {format_bytes(imbalance.peak_by_rank_bytes[low])}: imbalance "
            f"{imbalance.ratio:.2f}x ({format_bytes(imbalance.spread_bytes)} apart). Every rank needs the "
            f"memory of the highest.{waiting}")


def layers_view(store: TraceStore, names: list[str] | None, iteration: int | None,
                size_column: str | None) -> tuple[list[dict], go.Figure]:
    """The Layers table rows and the module treemap of one iteration of the first chosen run."""
    if not names or iteration is None:
        return [], empty_figure(_no_iteration(store, names))
    column = size_column if size_column in dict(TREE_SIZES) else "weight_bytes"
    try:
        layers = store.layers_at(names[0], int(iteration))
        model = str(store.meta(names[0]).get("model", "model"))
    except VIEW_ERRORS as exc:
        return [], empty_figure(cannot_read(store, names, exc))
    rows = layer_rows(layers, [key for key, _ in LAYER_TABLE_COLUMNS])  # bytes also as text in binary units
    return rows, layer_tree_figure(layers, column, root_label=model)


def _peak_at(store: TraceStore, name: str, iteration: int) -> tuple[str, str] | None:
    """The module and phase the profiler attributed an iteration's peak to, when it recorded them."""
    iterations = store.iterations(name)
    row = iterations[iterations["iteration"] == iteration]
    if row.empty or "peak_module" not in row.columns or not isinstance(row["peak_module"].iloc[0], str):
        return None
    return str(row["peak_module"].iloc[0]), str(row["peak_phase"].iloc[0])


def zoom_state(relayout: dict | None, names: list[str] | None, iteration: int | None) -> dict | None:
    """What a ``relayoutData`` event of the timeline asks for, or ``None`` when it changes no x-range.

    Returns:
        ``{"run", "iteration", "range"}``; ``range`` is ``[lo, hi]`` in ms, or ``None`` for a reset
        (double click, autorange).
    """
    if not relayout or not any(key.startswith("xaxis.range") or key == "xaxis.autorange" for key in relayout):
        return None
    x_range = relayout_range(relayout)
    return {"run": names[0] if names else None, "iteration": iteration,
            "range": list(x_range) if x_range is not None else None}


def timeline_view(store: TraceStore, names: list[str] | None, iteration: int | None,
                  zoom: dict | None = None, max_points: int = DEFAULT_MAX_POINTS) -> tuple[go.Figure, str]:
    """The memory timeline of one iteration, downsampled for the visible x-range, and a note on it.

    Args:
        store: the traces.
        names: the chosen runs (the first is drawn, the second overlaid).
        iteration: the iteration to draw.
        zoom: :func:`zoom_state` of the last zoom; ignored when it was made on another run or iteration.
        max_points: the most events drawn per series.
    """
    if not names or iteration is None:
        return empty_figure(_no_iteration(store, names)), ""
    try:
        frame = store.timeline(names[0], int(iteration))
        compare = store.timeline(names[1], int(iteration)) if len(names) > 1 else None
    except VIEW_ERRORS as exc:
        message = cannot_read(store, names, exc)
        return empty_figure(message), message
    if frame.empty:
        return empty_figure(f"iteration {iteration} has no events"), ""
    x_range = None
    if zoom and zoom.get("run") == names[0] and zoom.get("iteration") == iteration and zoom.get("range"):
        x_range = relayout_range({"xaxis.range": zoom["range"]})
    fig = timeline_figure(frame, x_range, max_points, compare, names[1] if len(names) > 1 else "",
                          revision=f"{names[0]}|{iteration}", peak_at=_peak_at(store, names[0], int(iteration)))
    drawn = len(fig.data[0].x)
    note = f"{drawn:,} of {len(frame):,} events drawn"
    if drawn < len(frame):
        note += " (the lowest and highest of each bucket of the visible range; zoom in for detail)"
    return fig, note + "."


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires the trace views' callbacks (the planner's are :func:`dashboard.callbacks_planner.register`)."""
    live.register(app, store)  # the problem line above every tab, and a live run's refresh
    drilldown.register(app, store)  # a click on the timeline lists the tensors alive then
    @app.callback(Output(ids.RUNS_TABLE, "data"), Output(ids.RUNS_TABLE, "selected_rows"),
                  Output(ids.RUNS_EMPTY, "children"), Output(ids.STATUS, "children"),
                  Input(ids.URL, "search"))
    def _runs(search):
        return runs_view(store, search)

    @app.callback(Output(ids.SELECTED_RUNS, "data"), Output(ids.RUNS_SELECTION, "children"),
                  Input(ids.RUNS_TABLE, "selected_rows"), State(ids.RUNS_TABLE, "data"))
    def _select(selected_rows, rows):
        return selected_names(selected_rows, rows)

    @app.callback(Output(ids.OVERVIEW_HEADLINE, "children"), Output(ids.OVERVIEW_PEAKS, "figure"),
                  Output(ids.OVERVIEW_BREAKDOWN, "figure"), Input(ids.SELECTED_RUNS, "data"),
                  Input(ids.LIVE_STAMP, "data"))  # a live run's new iterations (dashboard.live)
    def _overview(names, _stamp):
        return overview_view(store, names)

    @app.callback(Output(ids.OVERVIEW_RANKS_BOX, "style"), Output(ids.OVERVIEW_RANKS_TEXT, "children"),
                  Output(ids.OVERVIEW_RANKS, "figure"), Input(ids.SELECTED_RUNS, "data"))
    def _ranks(names):
        return ranks_view(store, names)

    @app.callback(Output(ids.LAYERS_ITERATION, "options"), Output(ids.LAYERS_ITERATION, "value"),
                  Output(ids.TIMELINE_ITERATION, "options"), Output(ids.TIMELINE_ITERATION, "value"),
                  Output(ids.OVERVIEW_DETAIL, "children"), Output(ids.LAYERS_DETAIL, "children"),
                  Output(ids.TIMELINE_DETAIL, "children"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.OVERVIEW_PEAKS, "clickData"),
                  Input(ids.LIVE_STAMP, "data"), State(ids.LAYERS_ITERATION, "value"),
                  State(ids.TIMELINE_ITERATION, "value"))
    def _iterations(names, click, _stamp, layers_value, timeline_value):
        note = detail_note(store, names)
        if dash.ctx.triggered_id == ids.LIVE_STAMP:  # new iterations of a live run: the open ones stay open
            options, value = iteration_options(store, names)
            kept = keep_open(options, value, layers_value, timeline_value)
            return options, kept[0], options, kept[1], note, note, note
        if dash.ctx.triggered_id == ids.OVERVIEW_PEAKS:
            # a click on the peaks figure picks the nearest detailed iteration; the options stay
            chosen = nearest_detailed(store, names, click)
            if chosen is None:
                raise dash.exceptions.PreventUpdate
            said = f"{note} Iteration {chosen} is open on the Layers and Timeline tabs."
            return dash.no_update, chosen, dash.no_update, chosen, said, note, note
        options, value = iteration_options(store, names)
        return options, value, options, value, note, note, note

    @app.callback(Output(ids.LAYERS_TABLE, "data"), Output(ids.LAYERS_TREE, "figure"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.LAYERS_ITERATION, "value"),
                  Input(ids.LAYERS_SIZE, "value"))
    def _layers(names, iteration, size_column):
        return layers_view(store, names, iteration, size_column)

    @app.callback(Output(ids.TIMELINE_ZOOM, "data"), Input(ids.TIMELINE_GRAPH, "relayoutData"),
                  State(ids.SELECTED_RUNS, "data"), State(ids.TIMELINE_ITERATION, "value"),
                  prevent_initial_call=True)
    def _zoom(relayout, names, iteration):
        # Plotly also reports resizes and y-only zooms; those must not redraw. Preventing this small
        # callback (not the figure's) keeps a pending figure request from being superseded by nothing.
        state = zoom_state(relayout, names, iteration)
        if state is None:
            raise dash.exceptions.PreventUpdate
        return state

    @app.callback(Output(ids.TIMELINE_GRAPH, "figure"), Output(ids.TIMELINE_INFO, "children"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.TIMELINE_ITERATION, "value"),
                  Input(ids.TIMELINE_ZOOM, "data"))
    def _timeline(names, iteration, zoom):
        return timeline_view(store, names, iteration, zoom)
