"""The iteration pickers of the Layers and Timeline tabs: only iterations with detail can be opened.

A long run keeps the detail (layers and events rows) of some iterations only (``Trace.detail_iterations``);
the pickers offer those, default to the one with the highest peak, and say how many there are. A click
on the Overview's peaks figure picks the detailed iteration nearest to it.
"""

from __future__ import annotations

import numpy as np

from dashboard.data import VIEW_ERRORS, TraceStore
from dashboard.figures_overview import decimate
from memprof.schema import costing_iterations
from memprof.units import format_bytes

#: The most iterations an iteration picker offers (a run whose every iteration has detail can have 100,000).
MAX_PICKER_OPTIONS = 5_000


def iteration_options(store: TraceStore, names: list[str] | None) -> tuple[list[dict], int | None]:
    """The first chosen run's detailed iterations for a dropdown, and the default: the one with the highest peak.

    Only iterations with detail (layers and events rows) can be opened, so only they are offered. When
    more than :data:`MAX_PICKER_OPTIONS` have detail, the lowest and highest peak of each stretch of them
    are offered (the highest always among them). A compiled run's costing iterations (which hold its layers,
    ``memprof.schema.costing_iterations``) say so.
    """
    if not names:
        return [], None
    try:
        iterations = store.iterations(names[0])
        detail = store.detail_iterations(names[0])
        costing = set(costing_iterations(store.meta(names[0])))  # a compiled run's: its layers come from them
    except VIEW_ERRORS:
        return [], None
    rows = iterations[iterations["iteration"].isin(detail)]
    if rows.empty:
        return [], None
    peaks = rows["peak_allocated_bytes"].to_numpy()
    numbers = rows["iteration"].to_numpy()
    keep = decimate(peaks, MAX_PICKER_OPTIONS)
    options = [{"label": f"iteration {i} (peak {format_bytes(p)}{'; a costing iteration' if i in costing else ''})",
                "value": i} for i, p in zip(numbers[keep].tolist(), peaks[keep].tolist())]
    return options, int(numbers[int(np.argmax(peaks))])


def detail_note(store: TraceStore, names: list[str] | None) -> str:
    """How many of the first chosen run's iterations were recorded and how many have detail."""
    if not names:
        return ""
    try:
        recorded, detailed = len(store.iterations(names[0])), len(store.detail_iterations(names[0]))
    except VIEW_ERRORS:
        return ""
    if not recorded:
        return ""
    if detailed == recorded:
        return f"All {recorded:,} iterations have detail (layers and timeline)."
    if not detailed:
        return f"None of the {recorded:,} iterations has detail: there are no layers or timeline to show."
    offered = f", the {MAX_PICKER_OPTIONS:,} listed span them" if detailed > MAX_PICKER_OPTIONS else ""
    return (f"{detailed:,} of {recorded:,} iterations have detail (layers and timeline{offered}); "
            f"they are marked on the peaks figure: click near one to open it.{_undetailed_peak(store, names[0])}")


def _undetailed_peak(store: TraceStore, name: str) -> str:
    """A sentence when the run's highest peak is an iteration without detail: which detailed one is opened."""
    iterations = store.iterations(name)
    peak = int(iterations.loc[iterations["peak_allocated_bytes"].idxmax(), "iteration"])
    detail = store.detail_iterations(name)
    opened = iterations[iterations["iteration"].isin(detail)]
    if peak in detail or opened.empty:
        return ""
    row = opened.loc[opened["peak_allocated_bytes"].idxmax()]
    return (f" The run's peak, iteration {peak}, has no detail; the highest detailed peak is iteration "
            f"{int(row['iteration'])} ({format_bytes(int(row['peak_allocated_bytes']))}), opened first.")


def nearest_detailed(store: TraceStore, names: list[str] | None, click: dict | None) -> int | None:
    """The detailed iteration of the first chosen run nearest to a point clicked on the peaks figure."""
    points = (click or {}).get("points") or []
    if not names or not points or not isinstance(points[0].get("x"), int | float):
        return None
    try:
        detail = store.detail_iterations(names[0])
    except VIEW_ERRORS:
        return None
    if not len(detail):
        return None
    x = float(points[0]["x"])
    at = int(np.searchsorted(detail, x))
    candidates = detail[max(at - 1, 0):at + 1]
    return int(candidates[np.argmin(np.abs(candidates - x))])


def keep_open(options: list[dict], default: int | None, *opened: int | None) -> list[int | None]:
    """For each picker, the iteration it has open when the options still offer it, else ``default``.

    A live run's refresh brings new options; the iteration a user opened must not jump to the new peak.
    """
    offered = {option["value"] for option in options}
    return [value if value in offered else default for value in opened]
