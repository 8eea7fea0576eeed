"""The post-mortem of a failed step: what was running and what filled memory."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from memprof.categories import CATEGORY_COLUMNS


def failure_details(events: pa.Table, layers: list[dict[str, Any]], iteration: int, top: int = 5) -> dict[str, Any]:
    """Describes memory when a step failed, from the flushed partial iteration.

    Args:
        events: the iteration's event rows (the last real event is where it failed).
        layers: the iteration's layer rows.
        iteration: the iteration number.
        top: how many feature-map holders to list.
    """
    rows = events.to_pylist()
    last = rows[-2] if len(rows) >= 2 else rows[-1]  # the final row is the synthetic 'end'
    holders = sorted((r for r in layers if r["module"] != ""), key=lambda r: r["feature_map_bytes"], reverse=True)
    return {
        "iteration": iteration,
        "phase": last["phase"],
        "last_event": f"{last['phase']} {last['event']} {last['module']!r}",
        "allocated_bytes": max(int(r["allocated_bytes"]) for r in rows),
        "categories": {name: int(last[name]) for name in CATEGORY_COLUMNS},
        "top_feature_maps": [{"module": r["module"], "kind": r["kind"], "feature_map_bytes": int(r["feature_map_bytes"])}
                             for r in holders[:top] if r["feature_map_bytes"] > 0],
    }
