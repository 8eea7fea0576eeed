"""The budget slider's callbacks: the chain's views drawn in the page, and the server for what they lack.

When the Planner tab opens, the server makes the chain's views once (:func:`planner_views`,
:mod:`dashboard.slider_views`) and the page shows every slider position from them with a client-side callback
(``assets/planner.js``): releasing the handle costs no request. Until the views arrive, or for a position they
lack (they are of another run, chain or planner model, or the chain is too long to hold them all), the page asks
the server for that one position (:func:`served_view`, :func:`dashboard.callbacks_planner.planner_view`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State

from dashboard import ids
from dashboard.callbacks_planner import comparisons, container_of, planner_view
from dashboard.data import VIEW_ERRORS, TraceStore
from dashboard.measured import MeasuredRun
from dashboard.planning import planner_inputs, planner_model
from dashboard.slider_views import slider_views, snapped_budget


def planner_views(store: TraceStore, names: list[str] | None, choice: str | None) -> dict[str, Any] | None:
    """The chain's slider views (:func:`dashboard.slider_views.slider_views`) with the planner inputs they are of
    (``"inputs"``, :func:`dashboard.planning.planner_inputs`), cached as the planner model is; ``None`` when there
    is no plan (the server then answers every position, with its message)."""
    if not names:
        return None
    container = container_of(choice)
    try:
        inputs = planner_inputs(store, names[0])
        model = planner_model(store, names[0], container)
        found = comparisons(store, names[0])
    except VIEW_ERRORS:
        return None
    measured = tuple(c.name if isinstance(c, MeasuredRun) else c[0] for c in found)  # a new one: new views
    # the model's own key, plus the Pareto traces' digest (torch.compile's points join them after the run)
    key = ("slider-views", str(store.path(names[0])), choice, inputs, model.pareto["layout"].get("datarevision"),
           measured)

    def build() -> dict[str, Any]:
        views = slider_views(model, found, names[0], choice, container)
        views["inputs"] = inputs
        return views

    return store.cache.get_or_build(key, build)


def served_view(store: TraceStore, request: dict | None) -> dict[str, Any]:
    """The server's answer to the page for a position its views lack: :func:`planner_view` at the slider's value,
    snapped to the slider's position as the views are (:func:`dashboard.slider_views.slider_budgets`).

    ``request`` is ``{"run", "choice", "value"}``; the answer echoes it as ``key`` with the seven outputs.
    """
    request = request if isinstance(request, dict) else {}
    run, choice, value = request.get("run"), request.get("choice"), request.get("value")
    names = [str(run)] if run else []
    budget = value
    if names and isinstance(value, (int, float)):
        with contextlib.suppress(*VIEW_ERRORS):
            budget = snapped_budget(planner_model(store, names[0], container_of(choice)), float(value))
    outputs = planner_view(store, names, choice, budget)
    return {"key": [run, choice, value], "outputs": list(outputs)}


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires the slider's views, the client-side callbacks that draw them and the server's answers."""

    # The chain's views, made when the Planner tab is open (not at every page load), sent once per run, chain and
    # planner model (a live run's model changes: dashboard.live_planner's PLANNER_DRAWN says so)
    @app.callback(Output(ids.PLANNER_VIEWS, "data"), Output(ids.PLANNER_VIEWS_KEY, "data"),
                  Input(ids.TABS, "value"), Input(ids.SELECTED_RUNS, "data"), Input(ids.PLANNER_CONTAINER, "value"),
                  Input(ids.PLANNER_DRAWN, "data"), State(ids.PLANNER_VIEWS_KEY, "data"))
    def _views(tab, names, choice, drawn, loaded):
        key = [names[0] if names else None, choice, drawn.get("inputs") if isinstance(drawn, dict) else None]
        if tab != ids.TAB_PLANNER or key == loaded:
            raise dash.exceptions.PreventUpdate
        return planner_views(store, names, choice), key

    # A slider position is drawn in the page from the views (assets/planner.js); one they lack asks the server
    # (the request), whose answer a second client-side callback draws if the slider still shows that position.
    # The views are a State, never an Input, of the first: Dash would hold every release (the first view of the
    # tab too) until a views request in flight is answered; a third callback draws the position when they arrive.
    shown = (Output(ids.PLANNER_BUDGET_TEXT, "children"), Output(ids.PLANNER_PEAK, "children"),
             Output(ids.PLANNER_MAKESPAN, "children"), Output(ids.PLANNER_SCHEDULE_TEXT, "children"),
             Output(ids.PLANNER_SCHEDULE_GRAPH, "figure"), Output(ids.PLANNER_PARETO_GRAPH, "figure"),
             Output(ids.PLANNER_CHOICE, "data"))
    again = tuple(Output(o.component_id, o.component_property, allow_duplicate=True) for o in shown)
    position = (Input(ids.PLANNER_BUDGET, "value"), Input(ids.SELECTED_RUNS, "data"),
                Input(ids.PLANNER_CONTAINER, "value"))
    at = tuple(State(i.component_id, i.component_property) for i in position)
    app.clientside_callback(ClientsideFunction("memprof", "plannerView"), *shown,
                            Output(ids.PLANNER_REQUEST, "data"), *position, State(ids.PLANNER_VIEWS, "data"),
                            State(ids.PLANNER_DRAWN, "data"), State(ids.PLANNER_SERVED, "data"))

    @app.callback(Output(ids.PLANNER_SERVED, "data"), Input(ids.PLANNER_REQUEST, "data"), prevent_initial_call=True)
    def _served(request):
        return served_view(store, request)

    app.clientside_callback(ClientsideFunction("memprof", "servedView"), *again, Input(ids.PLANNER_SERVED, "data"),
                            *at, State(ids.PLANNER_VIEWS, "data"), State(ids.PLANNER_DRAWN, "data"),
                            prevent_initial_call=True)
    app.clientside_callback(ClientsideFunction("memprof", "viewsArrived"), *again, Input(ids.PLANNER_VIEWS, "data"),
                            *at, State(ids.PLANNER_DRAWN, "data"), prevent_initial_call=True)
