"""The Runs and Layers tables: binary units shown, numbers sorted by (dashboard.tables)."""

from __future__ import annotations

import pandas as pd

from dashboard import callbacks as cb
from dashboard.layout import LAYER_TABLE_COLUMNS, build_layout
from dashboard.tables import RUN_SORT_KEYS, layer_rows, layer_sort_keys, sort_order, sort_rows
from memprof.units import format_bytes
from tests.dashboard.fixtures import LAYER_WEIGHT_BYTES

MIB = 1024**2


def _runs() -> list[dict]:
    return [{"name": "a", "peak": format_bytes(114 * MIB), "peak_bytes": 114 * MIB},
            {"name": "b", "peak": format_bytes(int(17.9 * MIB)), "peak_bytes": int(17.9 * MIB)},
            {"name": "c", "peak": "no iterations", "peak_bytes": 0},
            {"name": "d", "peak": format_bytes(512), "peak_bytes": 512}]


def test_peak_sorts_by_bytes_not_text():
    rows, _ = sort_rows(_runs(), [{"column_id": "peak", "direction": "asc"}], RUN_SORT_KEYS)
    assert [r["peak"] for r in rows] == ["no iterations", "512 B", "17.9 MiB", "114.0 MiB"]
    rows, _ = sort_rows(_runs(), [{"column_id": "peak", "direction": "desc"}], RUN_SORT_KEYS)
    assert [r["name"] for r in rows] == ["a", "b", "d", "c"]
    # as text it would have been the other way round: the bug this fixes
    assert sorted(["114.0 MiB", "17.9 MiB"]) == ["114.0 MiB", "17.9 MiB"]


def test_ticked_runs_move_with_their_rows_in_the_order_ticked():
    rows, selected = sort_rows(_runs(), [{"column_id": "peak", "direction": "asc"}], RUN_SORT_KEYS, [3, 0])
    assert [rows[i]["name"] for i in selected] == ["d", "a"]


def test_text_columns_sort_as_text_empty_last_and_no_sort_keeps_order():
    rows = [{"name": "b", "error": ""}, {"name": "A", "error": "x"}, {"name": "c", "error": None}]
    assert sort_order(rows, [{"column_id": "name", "direction": "asc"}], {}) == [1, 0, 2]
    assert sort_order(rows, [{"column_id": "error", "direction": "desc"}], {}) == [1, 0, 2]
    assert sort_order(rows, None, {}) == [0, 1, 2]


def test_layers_rows_show_binary_units_and_sort_by_bytes(store):
    rows, _ = cb.layers_view(store, ["mlp"], 0, "weight_bytes")
    keys = [k for k, _ in LAYER_TABLE_COLUMNS]
    numbers = layer_sort_keys(keys)
    assert numbers["weight_bytes_text"] == "weight_bytes"
    for row in rows:
        assert row["weight_bytes_text"] == format_bytes(row["weight_bytes"])
        assert row["weight_bytes_text"].endswith("B")  # never a raw integer
    ordered, _ = sort_rows(rows, [{"column_id": "weight_bytes_text", "direction": "desc"}], numbers)
    weights = [r["weight_bytes"] for r in ordered]
    assert weights == sorted(weights, reverse=True) and max(LAYER_WEIGHT_BYTES) in weights


def test_layer_rows_name_the_root():
    frame = pd.DataFrame({"module": ["", "fc"], "weight_bytes": [2048, 1536]})
    rows = layer_rows(frame, ["module", "weight_bytes"])
    assert [(r["module"], r["weight_bytes_text"]) for r in rows] == [("(model)", "2.0 KiB"), ("fc", "1.5 KiB")]


def _find(component, component_id):
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        found = _find(child, component_id)
        if found is not None:
            return found
    return None


def test_tables_sort_on_the_server_and_byte_headers_have_no_raw_unit():
    from dashboard import ids

    page = build_layout("traces")
    layers = _find(page, ids.LAYERS_TABLE)
    runs = _find(page, ids.RUNS_TABLE)
    assert layers.sort_action == runs.sort_action == "custom"
    headers = {c["id"]: c["name"] for c in layers.columns}
    assert headers["weight_bytes_text"] == "weights" and not any("(B)" in name for name in headers.values())
