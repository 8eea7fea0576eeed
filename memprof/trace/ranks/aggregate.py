"""Running aggregates of one rank's ``iterations`` rows, folded in batch by batch.

Per rank the pass keeps one summary row, its plotting buckets and the iterations it has seen as a
list of intervals (one interval for a run without gaps), never the rows themselves. A copy of an
iteration (a part written again after a crash, or listed while a compaction merges it) holds the
same values as the first: maxima are unaffected and the intervals count it once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

#: The numeric columns the aggregates read from every row.
NUMERIC_COLUMNS: tuple[str, ...] = ("iteration", "peak_allocated_bytes", "peak_reserved_bytes")


def _empty() -> np.ndarray:
    return np.empty(0, np.int64)


@dataclass
class RankAggregate:
    """Running aggregates of one rank over the batches seen so far.

    The plotting buckets split the rank's span of iterations, from ``first_iteration``, into equal
    ranges of ``width`` iterations; each keeps its highest peak, the iteration of it (the first on
    ties) and its highest reserved bytes (``-1`` while the bucket has no row).

    Attributes:
        rank: the rank.
        first_iteration: the first iteration of the span.
        width: iterations per bucket.
        peak_allocated_bytes, peak_iteration: the highest peak so far and its first iteration.
        peak_reserved_bytes: the highest reserved bytes so far.
        intervals: the distinct iterations seen, as sorted disjoint ``(first, last)`` intervals.
    """

    rank: int
    first_iteration: int
    width: int
    peak_allocated_bytes: int = -1
    peak_iteration: int = -1
    peak_reserved_bytes: int = -1
    intervals: list[tuple[int, int]] = field(default_factory=list)
    bucket_peak: np.ndarray = field(default_factory=_empty)
    bucket_iteration: np.ndarray = field(default_factory=_empty)
    bucket_reserved: np.ndarray = field(default_factory=_empty)

    @classmethod
    def start(cls, rank: int, first: int | None, last: int | None, max_points: int | None) -> RankAggregate:
        """Empty aggregates for the span ``[first, last]`` in at most ``max_points`` buckets (``None``: one per
        iteration)."""
        first = 0 if first is None else first
        span = 1 if last is None else last - first + 1
        width = max(1, -(-span // max_points)) if max_points else 1
        buckets = -(-span // width)
        return cls(rank, first, width, bucket_peak=np.full(buckets, -1, np.int64),
                   bucket_iteration=np.full(buckets, -1, np.int64), bucket_reserved=np.full(buckets, -1, np.int64))

    @property
    def iterations(self) -> int:
        """Distinct iterations seen."""
        return sum(high - low + 1 for low, high in self.intervals)

    def add(self, iteration: np.ndarray, allocated: np.ndarray, reserved: np.ndarray) -> None:
        """Folds rows of this rank, given as the arrays of :data:`NUMERIC_COLUMNS`.

        Raises:
            IndexError: an iteration lies outside the span the aggregates were started with.
        """
        if not len(iteration):
            return
        ordered = bool((np.diff(iteration) >= 0).all())  # parts hold iterations in order: no sort needed
        self._add_summary(iteration, allocated, reserved)
        self._add_buckets(iteration, allocated, reserved, ordered)
        self.intervals = merge_intervals(self.intervals, runs_of(iteration, ordered))

    def add_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Folds every row of ``batch`` (all of this rank)."""
        self.add(*(np.asarray(batch.column(name)) for name in NUMERIC_COLUMNS))

    def _add_summary(self, iteration: np.ndarray, allocated: np.ndarray, reserved: np.ndarray) -> None:
        top = int(allocated.max())
        first = int(iteration[allocated == top].min())
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, int(reserved.max()))
        if top > self.peak_allocated_bytes or (top == self.peak_allocated_bytes and first < self.peak_iteration):
            self.peak_allocated_bytes, self.peak_iteration = top, first

    def _add_buckets(self, iteration: np.ndarray, allocated: np.ndarray, reserved: np.ndarray,
                     ordered: bool) -> None:
        bucket = (iteration - self.first_iteration) // self.width
        if bucket.min() < 0 or bucket.max() >= len(self.bucket_peak):
            raise IndexError(f"rank {self.rank}: iterations {iteration.min()}..{iteration.max()} lie outside the "
                             "span its parts' footers announced")
        if ordered:  # buckets are contiguous runs: reduce each run
            starts = np.r_[0, np.flatnonzero(np.diff(bucket)) + 1]
            top = np.maximum.reduceat(allocated, starts)
            at_top = np.flatnonzero(allocated == np.repeat(top, np.diff(np.r_[starts, len(bucket)])))
            heads = at_top[np.searchsorted(at_top, starts)]  # each bucket's first row at its top
        else:  # sort by bucket, then highest peak, then first iteration: each bucket's head is its row
            order = np.lexsort((iteration, -allocated, bucket))
            sorted_buckets = bucket[order]
            heads = order[np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]]]
        where, value, at = bucket[heads], allocated[heads], iteration[heads]
        current, current_at = self.bucket_peak[where], self.bucket_iteration[where]
        better = (value > current) | ((value == current) & (at < current_at))
        self.bucket_peak[where[better]] = value[better]
        self.bucket_iteration[where[better]] = at[better]
        if ordered:
            self.bucket_reserved[where] = np.maximum(self.bucket_reserved[where],
                                                     np.maximum.reduceat(reserved, starts))
        else:
            np.maximum.at(self.bucket_reserved, bucket, reserved)


def runs_of(iteration: np.ndarray, ordered: bool = False) -> list[tuple[int, int]]:
    """The distinct values of ``iteration`` as ``(first, last)`` runs of consecutive integers.

    Args:
        iteration: the values.
        ordered: the values are already in ascending order (skips a sort).
    """
    values = iteration if ordered else np.sort(iteration)
    values = values[np.r_[True, np.diff(values) != 0]]
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts, ends = values[np.r_[0, breaks]], values[np.r_[breaks - 1, len(values) - 1]]
    return list(zip(starts.tolist(), ends.tolist()))


def merge_intervals(old: list[tuple[int, int]], new: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of two lists of inclusive integer intervals, as sorted disjoint intervals."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(old + new):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged
