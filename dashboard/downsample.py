"""Server-side min/max downsampling of a long series for the visible x-range.

A memory timeline can hold millions of events; a browser draws a few thousand points smoothly. The
visible range is cut into equal-count buckets and, from each bucket, the events holding the lowest
and the highest value are kept. The same indices are then used for every stacked series, so the
stack still sums to the total at every drawn point, and the highest point of the range (the peak)
is always among them.
"""

from __future__ import annotations

import numpy as np

#: Smallest ``max_points`` that leaves room for at least one bucket plus the range ends.
MIN_POINTS = 8


def visible_slice(x: np.ndarray, x_min: float | None, x_max: float | None) -> tuple[int, int]:
    """Returns ``(start, stop)`` of the events inside ``[x_min, x_max]``, widened by one event each side.

    The extra event on each side makes lines run to the edge of a zoomed view instead of stopping
    at the first event inside it.

    Args:
        x: ascending x values (e.g. milliseconds since the iteration began).
        x_min: left edge of the view, or ``None`` for the first event.
        x_max: right edge of the view, or ``None`` for the last event.
    """
    n = len(x)
    start = 0 if x_min is None else int(np.searchsorted(x, x_min, side="left"))
    stop = n if x_max is None else int(np.searchsorted(x, x_max, side="right"))
    return max(start - 1, 0), min(stop + 1, n)


def minmax_indices(y: np.ndarray, max_points: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Chooses at most ``max_points`` indices of ``y[start:stop]`` that keep every bucket's extremes.

    Args:
        y: the series that decides which events are kept (total allocated bytes).
        max_points: the most indices to return; at least :data:`MIN_POINTS`.
        start: first index of the range.
        stop: end of the range (exclusive); ``len(y)`` when ``None``.

    Returns:
        Ascending indices into ``y``: the range's first and last event and, per bucket, the index
        of its minimum and of its maximum. All indices of the range when it already fits.

    Raises:
        ValueError: ``max_points`` is below :data:`MIN_POINTS` or the range is reversed.
    """
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, found {max_points}")
    stop = len(y) if stop is None else stop
    if not 0 <= start <= stop <= len(y):
        raise ValueError(f"expected 0 <= start <= stop <= {len(y)}, found start={start}, stop={stop}")
    n = stop - start
    if n <= max_points:
        return np.arange(start, stop)
    buckets = (max_points - 2) // 2
    size = -(-n // buckets)
    pad = size * buckets - n
    values = np.asarray(y[start:stop], dtype=np.float64)
    # Padding with -inf/+inf keeps it out of argmax/argmin, except in a bucket made only of padding,
    # whose result is dropped below.
    highs = np.concatenate([values, np.full(pad, -np.inf)]).reshape(buckets, size)
    lows = np.concatenate([values, np.full(pad, np.inf)]).reshape(buckets, size)
    offsets = np.arange(buckets) * size
    chosen = np.concatenate(([0, n - 1], offsets + highs.argmax(axis=1), offsets + lows.argmin(axis=1)))
    chosen = np.unique(chosen)
    return chosen[chosen < n] + start
