"""The Planner view of a run still being written: its chain and Pareto front follow the run's new detail.

The planner model is cached on what it is built from (:func:`dashboard.planning.planner_inputs`: the detailed
iterations that cost the chain, the planning pass's ops, the metadata read), so a tick of a live run that added
iterations without detail builds nothing. When those inputs changed, the next change of the run seen while
the Planner tab is open (or opening the tab) builds the model once, sets the slider's range to the new front
and keeps the user's budget, held inside that range; setting the slider's value redraws the schedule and its
figures through the Planner's own callback (:mod:`dashboard.callbacks_planner`). Never while the slider is
dragged: its ``drag_value`` then differs from its ``value``, and the refresh waits for the next change.
"""

from __future__ import annotations

import contextlib
from typing import Any

import dash
from dash import Input, Output, State

from dashboard import ids
from dashboard.callbacks_planner import chain_options, container_of, planner_bounds
from dashboard.data import VIEW_ERRORS, TraceStore
from dashboard.planning import planner_inputs, planner_model


def drawn_inputs(store: TraceStore, names: list[str] | None, choice: str | None) -> dict[str, Any] | None:
    """What the Planner shows: ``{"run", "container", "inputs"}`` (``inputs``: the planner inputs' digest, ``None``
    when the run cannot be read); ``None`` without a chosen run."""
    if not names:
        return None
    inputs = None
    with contextlib.suppress(*VIEW_ERRORS):
        inputs = planner_inputs(store, names[0])
    return {"run": names[0], "container": container_of(choice), "inputs": inputs}


def is_dragging(value: float | None, drag_value: float | None) -> bool:
    """Whether the slider's handle is being dragged: its ``drag_value`` follows the handle, ``value`` the release."""
    if value is None or drag_value is None:
        return False
    return abs(float(drag_value) - float(value)) > max(1.0, abs(float(value)) * 1e-9)


def planner_refresh(store: TraceStore, names: list[str] | None, choice: str | None, tab: str | None,
                    budget: float | None, drag_value: float | None, drawn: dict | None) -> tuple[Any, ...] | None:
    """The Planner's new range when the run's planner inputs changed since it was drawn, else ``None``.

    Args:
        store: the traces.
        names: the chosen runs (the first is planned).
        choice: the chain picker's value.
        tab: the open tab (only the Planner tab is refreshed; opening it catches up).
        budget, drag_value: the slider's value and, while dragged, where its handle is.
        drawn: :func:`drawn_inputs` of what the Planner shows.

    Returns:
        ``(min, max, step, marks, value, disabled, message, chain options, drawn)``, or ``None`` when nothing is
        to be redrawn: another tab, a drag in progress, or the same inputs.
    """
    if not names or tab != ids.TAB_PLANNER or is_dragging(budget, drag_value):
        return None
    now = drawn_inputs(store, names, choice)
    if now is None or now["inputs"] is None or now == drawn:
        return None
    low, high, step, marks, value, disabled, message = planner_bounds(store, names, choice)  # the one build
    if not disabled and budget is not None:  # the user's budget stays, inside the new range
        with contextlib.suppress(*VIEW_ERRORS):
            value = planner_model(store, names[0], container_of(choice)).clamp(budget)
    options, _ = chain_options(store, names)  # the first detailed iteration may have arrived only now
    return low, high, step, marks, value, disabled, message, options, now


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires what the Planner shows, and its refresh when a live run's planner inputs change."""
    @app.callback(Output(ids.PLANNER_DRAWN, "data", allow_duplicate=True), Input(ids.SELECTED_RUNS, "data"),
                  Input(ids.PLANNER_CONTAINER, "value"), prevent_initial_call="initial_duplicate")
    def _drawn(names, choice):  # what the Planner's own callbacks draw for this run and chain
        return drawn_inputs(store, names, choice)

    slider = [Output(ids.PLANNER_BUDGET, prop, allow_duplicate=True)
              for prop in ("min", "max", "step", "marks", "value", "disabled")]

    @app.callback(*slider, Output(ids.PLANNER_MESSAGE, "children", allow_duplicate=True),
                  Output(ids.PLANNER_CONTAINER, "options", allow_duplicate=True),
                  Output(ids.PLANNER_DRAWN, "data", allow_duplicate=True),
                  Input(ids.LIVE_STAMP, "data"), Input(ids.TABS, "value"), State(ids.SELECTED_RUNS, "data"),
                  State(ids.PLANNER_CONTAINER, "value"), State(ids.PLANNER_BUDGET, "value"),
                  State(ids.PLANNER_BUDGET, "drag_value"), State(ids.PLANNER_DRAWN, "data"), prevent_initial_call=True)
    def _refresh(_stamp, tab, names, choice, budget, drag_value, drawn):
        found = planner_refresh(store, names, choice, tab, budget, drag_value, drawn)
        if found is None:
            raise dash.exceptions.PreventUpdate
        return found
