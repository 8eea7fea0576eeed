"""What is wrong with the chosen run (one line above every tab), and following a run that is still written.

The problem line comes from :meth:`dashboard.data.TraceStore.problem`: the same words for a damaged run
(the parts skipped and the iterations they cost), an interrupted one (its writer died) or one that cannot
be opened, whichever tab is shown.

A run whose writer is alive turns the page's ``dcc.Interval`` on, and so does any running run listed in the
Runs table. Each tick compares the chosen run's stamp (the modification times of its table folders and
journal) with the last one; only when it changed does the ``LIVE_STAMP`` store change, which redraws the views
that follow the run (the Planner's only when its inputs changed: :mod:`dashboard.live_planner`). The same tick
summarises the running rows of the Runs table again (:mod:`dashboard.live_runs`). Reading a run again costs
only the new parts: the store's part cache keys every footer and part on its name, time and size. Once no
chosen or listed run is being written (closed, or its writer died), the interval is turned off.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State

from dashboard import ids, live_planner
from dashboard.data import VIEW_ERRORS, TraceStore
from dashboard.live_runs import any_running, live_rows

_SHOWN, _HIDDEN = {"display": "block"}, {"display": "none"}


def problem_view(store: TraceStore, names: list[str] | None) -> tuple[str, dict]:
    """The problem line of the first chosen run and its style (hidden when the run has none)."""
    problem = store.problem(names[0]) if names else None
    return (problem or "", _SHOWN if problem else _HIDDEN)


def live_switch(store: TraceStore, names: list[str] | None, rows: list[dict] | None = None) -> bool:
    """Whether the refresh interval is off (``disabled``): on only while the first chosen run, or a run listed in
    the Runs table (``rows``), is being written."""
    return not (store.is_live(names[0] if names else None) or any_running(rows))


def live_tick(store: TraceStore, names: list[str] | None, last: dict | None,
              rows: list[dict] | None = None) -> tuple[dict | None, bool]:
    """One tick of the interval: the new stamp when the run changed (``None``: no change), and whether to stop.

    Args:
        store: the traces.
        names: the chosen runs (the first is followed).
        last: the stamp store's value: ``{"run", "stamp"}`` of the last change seen.
        rows: the Runs table's rows; a running one keeps the interval on.
    """
    listed = any_running(rows)
    if not names:
        return None, not listed
    try:
        stamp = list(store.stamp(names[0]))
    except VIEW_ERRORS:
        return None, not listed
    stop = not (store.is_live(names[0]) or listed)  # closed or died since: this tick's redraw is the last
    if last and last.get("run") == names[0] and last.get("stamp") == stamp:
        return None, stop
    return {"run": names[0], "stamp": stamp}, stop


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires the problem line and the live refresh."""
    @app.callback(Output(ids.RUN_PROBLEM, "children"), Output(ids.RUN_PROBLEM, "style"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.LIVE_STAMP, "data"))
    def _problem(names, _stamp):
        return problem_view(store, names)

    @app.callback(Output(ids.LIVE_INTERVAL, "disabled", allow_duplicate=True), Input(ids.SELECTED_RUNS, "data"),
                  Input(ids.RUNS_TABLE, "data"), prevent_initial_call="initial_duplicate")
    def _switch(names, rows):
        return live_switch(store, names, rows)

    @app.callback(Output(ids.LIVE_STAMP, "data"), Output(ids.LIVE_INTERVAL, "disabled"),
                  Input(ids.LIVE_INTERVAL, "n_intervals"), State(ids.SELECTED_RUNS, "data"),
                  State(ids.LIVE_STAMP, "data"), State(ids.RUNS_TABLE, "data"), prevent_initial_call=True)
    def _tick(_n, names, last, rows):
        stamp, stop = live_tick(store, names, last, rows)
        return (dash.no_update if stamp is None else stamp), stop

    @app.callback(Output(ids.RUNS_TABLE, "data", allow_duplicate=True), Input(ids.LIVE_INTERVAL, "n_intervals"),
                  State(ids.RUNS_TABLE, "data"), prevent_initial_call=True)
    def _runs(_n, rows):  # the running runs' counts, peaks and states; nothing sent when none changed
        fresh = live_rows(store, rows)
        if fresh is None:
            raise dash.exceptions.PreventUpdate
        return fresh

    live_planner.register(app, store)
