"""The Runs table's order and look: measured runs under the run they measured, newest first, 1600 px wide.

A measured run (a planner schedule executed and profiled again, :mod:`planner.measure`) names the run its
chain came from in ``meta.json`` (``source_run``, a run id). The table lists every other run newest first,
each followed by its measured runs, newest first, indented; a measured run whose source is not in the
folder stands on its own. The user may sort by any column afterwards (that order is theirs).
"""

from __future__ import annotations

from typing import Any

#: Widths that keep the whole table within 1600 px (the error column wraps instead of widening the page).
RUN_COLUMN_WIDTHS_PX: dict[str, int] = {
    "name": 220, "kind": 210, "state": 110, "model": 130, "device": 70, "created": 110, "rank": 55,
    "iterations": 95, "peak": 110, "error": 400,
}
#: The widest the table may be.
RUNS_TABLE_MAX_PX = 1600


def group_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Orders summary rows (``dashboard.data.TraceStore.summary``): newest first, measured runs under their source.

    A row is a measured run when its ``source`` (the source run's id) is not empty; its source is the row
    whose ``run_id`` matches. Ranks of one distributed run keep their order (they share a creation time).
    """
    by_id: dict[str, int] = {}
    for index, row in enumerate(rows):
        by_id.setdefault(str(row.get("run_id") or ""), index)
    children: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    tops: list[tuple[int, dict[str, Any]]] = []
    for index, row in enumerate(rows):
        parent = by_id.get(str(row.get("source") or "")) if row.get("source") else None
        if parent is not None and parent != index and not rows[parent].get("source"):
            children.setdefault(parent, []).append((index, row))
        else:
            tops.append((index, row))
    ordered: list[dict[str, Any]] = []
    for index, row in _newest_first(tops):
        ordered.append(row)
        ordered.extend(child for _, child in _newest_first(children.get(index, [])))
    return ordered


def _newest_first(rows: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    # newest first; rows created in the same second (the ranks of one run) keep their folder order
    return sorted(rows, key=lambda item: (str(item[1].get("created") or ""), -item[0]), reverse=True)


def runs_table_style() -> dict[str, Any]:
    """The DataTable properties that size the Runs table and indent measured runs under their source."""
    widths = [{"if": {"column_id": key}, "width": f"{px}px", "maxWidth": f"{px}px", "minWidth": f"{px // 2}px"}
              for key, px in RUN_COLUMN_WIDTHS_PX.items()]
    return {
        "style_table": {"overflowX": "auto", "maxWidth": f"{RUNS_TABLE_MAX_PX}px"},
        "style_cell": {"fontFamily": "monospace", "fontSize": "13px", "padding": "2px 8px", "textAlign": "left",
                       "whiteSpace": "normal", "height": "auto", "overflow": "hidden", "textOverflow": "ellipsis"},
        "style_cell_conditional": widths,
        "style_data_conditional": [
            {"if": {"filter_query": '{error} != ""'}, "color": "#b00020"},
            {"if": {"filter_query": '{source} != ""', "column_id": "name"}, "paddingLeft": "28px"},
            {"if": {"filter_query": '{state} = "interrupted"', "column_id": "state"}, "color": "#b00020",
             "fontWeight": "bold"},
            {"if": {"filter_query": '{state} = "running"', "column_id": "state"}, "color": "#1565c0",
             "fontWeight": "bold"},
        ],
    }
