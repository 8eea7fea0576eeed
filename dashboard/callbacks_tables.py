"""The tables' server-side sorting: Dash sorts the shown text, so the Runs and Layers tables sort here, by the
numbers behind their binary units (:mod:`dashboard.tables`)."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, State

from dashboard import ids
from dashboard.layout import LAYER_TABLE_COLUMNS
from dashboard.tables import RUN_SORT_KEYS, layer_sort_keys, sort_rows


def register(app: Any) -> None:
    """Wires the server-side sorting of the Runs and Layers tables (``sort_action="custom"``)."""
    layer_numbers = layer_sort_keys(key for key, _ in LAYER_TABLE_COLUMNS)

    @app.callback(Output(ids.RUNS_TABLE, "data", allow_duplicate=True),
                  Output(ids.RUNS_TABLE, "selected_rows", allow_duplicate=True),
                  Input(ids.RUNS_TABLE, "sort_by"), State(ids.RUNS_TABLE, "data"),
                  State(ids.RUNS_TABLE, "selected_rows"), prevent_initial_call=True)
    def _sort_runs(sort_by, rows, selected):  # the ticked runs move with their rows
        return sort_rows(rows or [], sort_by, RUN_SORT_KEYS, selected or [])

    @app.callback(Output(ids.LAYERS_TABLE, "data", allow_duplicate=True), Input(ids.LAYERS_TABLE, "sort_by"),
                  State(ids.LAYERS_TABLE, "data"), prevent_initial_call=True)
    def _sort_layers(sort_by, rows):
        return sort_rows(rows or [], sort_by, layer_numbers)[0]
