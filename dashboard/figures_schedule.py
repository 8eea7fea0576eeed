"""The Planner's schedule and its predicted memory as one figure on one time axis.

The schedule's operations (one row per stage) sit above the memory they cause, both drawn against the same
x axis: zooming or panning one moves the other, a vertical spike line crosses both rows under the pointer,
and each operation's hover says its memory (:data:`dashboard.figures_planner.MEMORY_HOVER`). Built from the
two figures :func:`dashboard.figures_options.schedule_figure_with_options` and
:func:`dashboard.figures_planner.memory_figure` make, in plotly's JSON form (see ``figures_planner``).
"""

from __future__ import annotations

from typing import Any

from dashboard.figures_planner import Figure

#: The share of the plot's height the schedule's rows take (the memory below takes the rest, less a gap).
SCHEDULE_SHARE = 0.55
_GAP = 0.07
#: Height of the memory row, in pixels.
MEMORY_HEIGHT_PX = 300
#: Where the memory figure's y axes go: under the schedule's rows (``y2``), its host axis beside it (``y3``).
_MOVED = {"y": "y2", "y2": "y3"}


def _retarget(items: list[dict[str, Any]], axes: dict[str, str], key: str) -> list[dict[str, Any]]:
    """Copies of traces (``key="yaxis"``) or shapes and notes (``key="yref"``) moved to other y axes."""
    out = []
    for item in items:
        axis = item.get(key, "y")
        out.append({**item, key: axes.get(axis, axis)} if axis in axes else dict(item))
    return out


def planner_figure(schedule: Figure, memory: Figure) -> Figure:
    """One figure: ``schedule`` on the top row, ``memory`` below, sharing one x axis.

    ``schedule``'s y axis stays ``y``; ``memory``'s becomes ``y2`` (its host axis, when it has one, ``y3``).
    The x axis is ``memory``'s (its title, at the bottom), with spikes across both rows.
    """
    return {"data": planner_data(schedule["data"], memory["data"]),
            "layout": planner_layout(schedule["layout"], memory["layout"])}


def planner_data(schedule: list[dict[str, Any]], memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traces of :func:`planner_figure`: the schedule's on ``y``, the memory's moved to ``y2`` (and ``y3``)."""
    return [*(dict(t, xaxis="x", yaxis="y") for t in schedule),
            *(dict(t, xaxis="x") for t in _retarget(memory, _MOVED, "yaxis"))]


def planner_layout(schedule_layout: dict[str, Any], memory_layout: dict[str, Any]) -> dict[str, Any]:
    """The layout of :func:`planner_figure`; the budget slider's views make one per position (cheap)."""
    total = int(schedule_layout.get("height", 300)) + MEMORY_HEIGHT_PX
    split = MEMORY_HEIGHT_PX / total
    layout: dict[str, Any] = {
        **{k: v for k, v in schedule_layout.items() if k not in ("xaxis", "yaxis", "height", "title")},
        "title": {"text": "Schedule and its predicted memory, on one time axis (hover an operation for its memory)"},
        "height": total,
        "xaxis": {**memory_layout.get("xaxis", {}), "anchor": "y2", "showspikes": True, "spikemode": "across",
                  "spikesnap": "cursor", "spikethickness": 1, "spikecolor": "#888888", "spikedash": "dot"},
        "yaxis": {**schedule_layout.get("yaxis", {}), "domain": [split + _GAP, 1.0], "anchor": "x"},
        "yaxis2": {**memory_layout.get("yaxis", {}), "domain": [0.0, split], "anchor": "x"},
        "hovermode": "closest", "spikedistance": -1,
        "legend": {"orientation": "h", "y": -0.12 * 600 / total},
    }
    if "yaxis2" in memory_layout:
        layout["yaxis3"] = {**memory_layout["yaxis2"], "overlaying": "y2", "anchor": "x"}
    shapes = _retarget(memory_layout.get("shapes", []), _MOVED, "yref")
    notes = _retarget(memory_layout.get("annotations", []), _MOVED, "yref")
    if shapes:
        layout["shapes"] = shapes
    if notes:
        layout["annotations"] = notes
    return layout
