"""The Runs table of a folder whose runs are still being written: each running run's row follows it.

On every tick of the live interval (:mod:`dashboard.live`) the rows whose state is ``running`` are summarised
again (:meth:`dashboard.data.TraceStore.summary`): their ``meta.json`` is read (a run closes, fails, or its
writer dies), and their iterations only when the run's stamp changed, since the summary is cached on the stamp
and the store's part cache then reads only the parts written since. Rows keep their place (the user's sort),
so the ticked rows stay ticked; a tick that changes nothing sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dashboard.data import VIEW_ERRORS, TraceStore
from memprof.trace.liveness import RUNNING

#: The columns of a row that follow its run (``peak_bytes`` is what ``peak`` sorts by).
LIVE_COLUMNS: tuple[str, ...] = ("iterations", "peak", "peak_bytes", "state", "error")


def any_running(rows: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether a row of the Runs table is a run still being written (the interval then stays on)."""
    return any(row.get("state") == RUNNING for row in rows or ())


def live_rows(store: TraceStore, rows: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The Runs table's rows, each running run's count, peak, state and error read again.

    Args:
        store: the traces.
        rows: the table's rows as the browser has them (in the user's order).

    Returns:
        The rows with what changed, or ``None`` when no row changed (nothing to send).
    """
    fresh_rows: list[dict[str, Any]] = []
    changed = False
    for row in rows or ():
        update = _changes(store, row) if row.get("state") == RUNNING else {}
        changed |= bool(update)
        fresh_rows.append({**row, **update})
    return fresh_rows if changed else None


def _changes(store: TraceStore, row: Mapping[str, Any]) -> dict[str, Any]:
    """The live columns of a running run's row that differ from what it shows now."""
    try:
        fresh = store.summary(store.entry(str(row.get("name", ""))))
    except VIEW_ERRORS:  # moved away or renamed since it was listed: the row stays as it was
        return {}
    return {key: fresh[key] for key in LIVE_COLUMNS if row.get(key) != fresh[key]}
