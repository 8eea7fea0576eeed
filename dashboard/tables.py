"""Tables in binary units that sort by the numbers: the Runs and Layers tables.

A Dash ``DataTable`` formats numbers with d3-format, which knows decimal prefixes (``18M``) but not the binary
units every other number on the page is written in (``17.9 MiB``); and a column of such texts sorts as text
(``114.0 MiB`` before ``17.9 MiB``). So a byte column is shown as text (:func:`memprof.units.format_bytes`) and
its number stays in the row under another key, which the table never shows; the tables sort on the server
(``sort_action="custom"``): :func:`sort_rows` orders the rows by those numbers.

Column ids: a byte column shown as ``<key>`` has its number under :data:`SORT_KEYS` ``[<key>]``; the Layers
table's byte columns are ``<column>_text`` beside the layers table's own ``<column>`` (``weight_bytes_text``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from memprof.units import format_bytes

#: The suffix of a byte column's text beside its number.
TEXT_SUFFIX = "_text"
#: The Runs table: the column shown -> the number it sorts by.
RUN_SORT_KEYS: dict[str, str] = {"peak": "peak_bytes"}


def byte_text_key(column: str) -> str:
    """The id of the text shown for a byte column of the layers table (``weight_bytes`` -> ``weight_bytes_text``)."""
    return column + TEXT_SUFFIX


def layer_rows(layers: pd.DataFrame, columns: Iterable[str]) -> list[dict[str, Any]]:
    """The Layers table's rows: every column as is, each ``*_bytes`` one also as text in binary units.

    The root module (empty name) is shown as ``(model)``.
    """
    keys = list(columns)
    rows = layers[keys].to_dict("records")
    byte_columns = [key for key in keys if key.endswith("_bytes")]
    for row in rows:
        row["module"] = row["module"] or "(model)"
        for key in byte_columns:
            row[byte_text_key(key)] = format_bytes(int(row[key]))
    return rows


def layer_sort_keys(columns: Iterable[str]) -> dict[str, str]:
    """The Layers table's byte columns: text shown -> number sorted by."""
    return {byte_text_key(key): key for key in columns if key.endswith("_bytes")}


def _key(value: Any) -> tuple[int, Any]:
    """A sort key that orders numbers numerically, then texts, with empty cells last."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return (2, 0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value).lower())


def sort_order(rows: Sequence[Mapping[str, Any]], sort_by: Sequence[Mapping[str, str]] | None,
               numbers: Mapping[str, str]) -> list[int]:
    """The positions of ``rows`` in the order a table's ``sort_by`` asks for.

    Args:
        rows: the table's rows.
        sort_by: Dash's ``sort_by``: ``[{"column_id": ..., "direction": "asc" | "desc"}, ...]``, most important first.
        numbers: for a column shown as text, the key of the number it sorts by.
    """
    order = list(range(len(rows)))
    for spec in reversed(list(sort_by or [])):  # stable sorts, least important first
        column = numbers.get(spec.get("column_id", ""), spec.get("column_id", ""))
        descending = spec.get("direction") == "desc"
        filled = [i for i in order if _key(rows[i].get(column))[0] < 2]
        empty = [i for i in order if _key(rows[i].get(column))[0] == 2]
        filled.sort(key=lambda i: _key(rows[i].get(column)), reverse=descending)
        order = filled + empty  # empty cells last either way
    return order


def sort_rows(rows: Sequence[Mapping[str, Any]], sort_by: Sequence[Mapping[str, str]] | None,
              numbers: Mapping[str, str], selected: Sequence[int] = ()) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows sorted as ``sort_by`` asks, and the selected row positions moved with their rows."""
    order = sort_order(rows, sort_by, numbers)
    moved = {old: new for new, old in enumerate(order)}
    return [dict(rows[i]) for i in order], [moved[i] for i in selected if i in moved]

