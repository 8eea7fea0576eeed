"""The Timeline tab's drill-down: a click on the memory timeline lists the tensors alive at that moment.

The clicked point's time is matched to the nearest events row of the iteration; the rows are the blocks
alive there (:func:`memprof.trace.drilldown.live_allocations`), largest first, with their category, the
module and phase that allocated them, the op that made them, and for the largest the Python stack (the
innermost frame in the list, the whole stack on hover).
"""

from __future__ import annotations

from typing import Any

import dash
import numpy as np
from dash import Input, Output

from dashboard import ids
from dashboard.data import VIEW_ERRORS, TraceStore
from memprof.trace.drilldown import live_allocations
from memprof.units import format_bytes

#: The most tensors listed (the largest); the note says how many more there are and their bytes.
MAX_LISTED = 200
#: Columns of the list: (key, header).
TENSOR_COLUMNS: tuple[tuple[str, str], ...] = (
    ("size", "size"), ("category", "category"), ("module", "module"), ("op", "op"), ("phase", "allocated in"),
    ("called_from", "called from (hover for the stack)"),
)


def clicked_seq(store: TraceStore, name: str, iteration: int, click: dict | None) -> int | None:
    """The events row nearest to a point clicked on the timeline (its x is ms since the iteration began)."""
    points = (click or {}).get("points") or []
    if not points or not isinstance(points[0].get("x"), int | float):
        return None
    frame = store.timeline(name, iteration)
    if frame.empty:
        return None
    times = frame["time_ms"].to_numpy(dtype=float)
    return int(frame["seq"].iloc[int(np.argmin(np.abs(times - float(points[0]["x"]))))])


def tensors_view(store: TraceStore, names: list[str] | None, iteration: int | None,
                 click: dict | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The list's rows, their hover texts (the stacks) and a note, for a click on the timeline."""
    if not names or iteration is None:
        return [], [], ""
    try:
        seq = clicked_seq(store, names[0], int(iteration), click)
        if seq is None:
            return [], [], "Click a point of the timeline to list the tensors alive at that moment."
        frame = store.memo(names[0], ("live", int(iteration), seq),
                           lambda _: live_allocations(store.trace(names[0]), int(iteration), seq))
    except VIEW_ERRORS as exc:
        return [], [], store.problem(names[0]) or f"Cannot list the tensors: {exc}"
    at = store.timeline(names[0], int(iteration))
    row = at[at["seq"] == seq].iloc[0]
    moment = (f"{row['time_ms']:.3f} ms into iteration {iteration} ({row['phase']}"
              f"{', ' + str(row['module']) if row['module'] else ''})")
    if frame.empty:
        return [], [], (f"No allocation records at {moment}: this trace predates them, or the iteration was "
                        "recorded without them.")
    shown = frame.head(MAX_LISTED)
    rows = [{"size": format_bytes(int(r.bytes)), "bytes": int(r.bytes), "category": r.category,
             "module": r.module or "(none)", "op": r.op or _no_op(r.phase), "phase": r.phase,
             "called_from": r.stack.splitlines()[-1] if r.stack else ""} for r in shown.itertuples()]
    # plain text, never Markdown: file names come from the trace (the page renders no data as HTML)
    tips = [{"called_from": {"value": r.stack, "type": "text"}} if r.stack else {} for r in shown.itertuples()]
    rest = frame.iloc[MAX_LISTED:]
    more = f"; {len(rest)} smaller ones ({format_bytes(int(rest['bytes'].sum()))}) not listed" if len(rest) else ""
    note = (f"{len(frame)} tensors alive at {moment}: {format_bytes(int(frame['bytes'].sum()))} in all, "
            f"the largest first{more}.")
    return rows, tips, note


def _no_op(phase: str) -> str:
    """What made an allocation no Python call made: it predates the iteration, or autograd's backward did."""
    return {"before": "(before the iteration)", "backward": "(autograd backward)"}.get(phase, "")


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires the timeline's click to the list."""
    @app.callback(Output(ids.TIMELINE_TENSORS, "data"), Output(ids.TIMELINE_TENSORS, "tooltip_data"),
                  Output(ids.TIMELINE_TENSORS_NOTE, "children"), Input(ids.TIMELINE_GRAPH, "clickData"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.TIMELINE_ITERATION, "value"))
    def _tensors(click, names, iteration):
        if dash.ctx.triggered_id != ids.TIMELINE_GRAPH:
            click = None  # another run or iteration: the old click means nothing there
        elif not click:
            raise dash.exceptions.PreventUpdate  # the graph cleared its click (a redraw): the list stays
        return tensors_view(store, names, iteration, click)
