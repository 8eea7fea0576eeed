"""One streaming pass over the ``iterations`` tables of every rank, read as one Parquet dataset.

The parts of all ranks form one :mod:`pyarrow.dataset` partitioned on ``rank=<r>``; only the columns
the aggregates need are read, batch by batch, into running aggregates per rank. Memory holds one batch
(times the scanner's small read-ahead) plus, per rank, one summary row, its plotting buckets and the
iterations it has seen as a list of intervals (one interval for a run without gaps).

An iteration can appear twice (a part written again after a crash, or a part listed while a compaction
merges it): both copies hold the same values, so maxima are unaffected and the interval list counts it
once. Iterations still in a rank's journal (a killed or running rank) are folded in like a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from memprof.errors import CorruptTraceError, RankTraceError, TraceError
from memprof.trace.reader import read_meta, table_parts
from memprof.trace.recovery import recover, recovered_frame
from memprof.trace.schema import ITERATIONS, ITERATIONS_SCHEMA

#: The columns of ``iterations`` that one pass reads.
SCAN_COLUMNS: tuple[str, ...] = ("iteration", "peak_allocated_bytes", "peak_reserved_bytes", "peak_module",
                                 "peak_phase")
_SCHEMA = pa.schema([*(ITERATIONS_SCHEMA.field(name) for name in SCAN_COLUMNS), pa.field("rank", pa.int64())])
_PARTITIONING = ds.partitioning(pa.schema([pa.field("rank", pa.int64())]), flavor="hive")
#: Rows per batch and batches read ahead: bound the memory of the pass (a few MB per batch).
BATCH_ROWS = 65_536
_READ_AHEAD = {"batch_readahead": 2, "fragment_readahead": 2}
#: Passes tried when parts vanish mid-pass (merged away by a compaction): plan and scan again.
ATTEMPTS = 3


@dataclass(frozen=True)
class RankPlan:
    """What a pass reads of one rank: its parts, the span of its iterations and its journal's rows.

    Attributes:
        rank: the rank.
        parts: the ``iterations`` parts, in write order.
        first_iteration, last_iteration: the span of iterations (from the parts' footers and the
            journal); ``None`` when the rank has none yet.
        recovered: rows of iterations still in the rank's journal (``None`` without a journal).
    """

    rank: int
    parts: tuple[Path, ...]
    first_iteration: int | None
    last_iteration: int | None
    recovered: pa.RecordBatch | None


def plan_rank(rank: int, directory: Path) -> RankPlan:
    """Validates one rank's metadata and ``iterations`` footers; finds the span of its iterations.

    Raises:
        RankTraceError: the rank's metadata, a part's footer or its journal cannot be read.
    """
    try:
        read_meta(directory)
        parts = tuple(table_parts(directory, ITERATIONS))
        spans = [_part_span(part) for part in parts]
        frame = recovered_frame(recover(directory), ITERATIONS)
    except TraceError as exc:
        raise RankTraceError(f"rank {rank} of {directory.parent} cannot be read: {exc}; fix or move away "
                             f"{directory} to compare the other ranks", rank) from exc
    recovered = None
    if frame is not None and len(frame):
        recovered = pa.RecordBatch.from_pandas(frame[list(SCAN_COLUMNS)].assign(rank=rank), schema=_SCHEMA,
                                               preserve_index=False)
        spans.append((int(frame["iteration"].min()), int(frame["iteration"].max())))
    spans = [s for s in spans if s is not None]
    first = min((s[0] for s in spans), default=None)
    last = max((s[1] for s in spans), default=None)
    return RankPlan(rank, parts, first, last, recovered)


def _part_span(part: Path) -> tuple[int, int] | None:
    """``(first, last)`` iteration of a part (``None`` when empty); checks the scanned columns' types."""
    try:
        metadata = pq.read_metadata(part)
        schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        raise CorruptTraceError(f"{part} is not a readable Parquet file ({exc}); it may be truncated") from None
    wrong = [f"{name} (expected {ITERATIONS_SCHEMA.field(name).type})" for name in SCAN_COLUMNS
             if name not in schema.names or not schema.field(name).type.equals(ITERATIONS_SCHEMA.field(name).type)]
    if wrong:
        raise CorruptTraceError(f"{part} is not a memprof iterations table: missing or mistyped {', '.join(wrong)}")
    column = schema.get_field_index("iteration")
    lows, highs = [], []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        stats = group.column(column).statistics
        if group.num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:  # a foreign writer without statistics: read the column
            iterations = pq.read_table(part, columns=["iteration"]).column(0)
            return (int(pc.min(iterations).as_py()), int(pc.max(iterations).as_py())) if len(iterations) else None
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else None


@dataclass
class RankAggregate:
    """Running aggregates of one rank over the batches seen so far.

    The plotting buckets split ``[first_iteration, last_iteration]`` into at most ``max_points``
    equal ranges of iterations; each keeps its highest peak, the iteration of it (the first on
    ties) and its highest reserved bytes.
    """

    rank: int
    first_iteration: int
    width: int
    peak_allocated_bytes: int = -1
    peak_iteration: int = -1
    peak_module: str = ""
    peak_phase: str = ""
    peak_reserved_bytes: int = -1
    intervals: list[tuple[int, int]] = field(default_factory=list)
    bucket_peak: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bucket_iteration: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bucket_reserved: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @classmethod
    def start(cls, plan: RankPlan, max_points: int | None) -> RankAggregate:
        """Empty aggregates sized for the plan's span of iterations (one bucket per iteration without a limit)."""
        first = plan.first_iteration if plan.first_iteration is not None else 0
        span = plan.last_iteration - first + 1 if plan.last_iteration is not None else 1
        width = max(1, -(-span // max_points)) if max_points else 1
        buckets = -(-span // width)
        return cls(plan.rank, first, width, bucket_peak=np.full(buckets, -1, np.int64),
                   bucket_iteration=np.full(buckets, -1, np.int64), bucket_reserved=np.full(buckets, -1, np.int64))

    @property
    def iterations(self) -> int:
        """Distinct iterations seen."""
        return sum(high - low + 1 for low, high in self.intervals)

    def add(self, batch: pa.RecordBatch, rows: np.ndarray | None = None) -> None:
        """Folds the rows ``rows`` of ``batch`` (all rows when ``None``), which all belong to this rank."""
        iteration = batch.column("iteration").to_numpy()
        allocated = batch.column("peak_allocated_bytes").to_numpy()
        reserved = batch.column("peak_reserved_bytes").to_numpy()
        if rows is not None:
            iteration, allocated, reserved = iteration[rows], allocated[rows], reserved[rows]
        if not len(iteration):
            return
        self._add_summary(batch, rows, iteration, allocated, reserved)
        self._add_buckets(iteration, allocated, reserved)
        self.intervals = merge_intervals(self.intervals, runs_of(iteration))

    def _add_summary(self, batch: pa.RecordBatch, rows: np.ndarray | None, iteration: np.ndarray,
                     allocated: np.ndarray, reserved: np.ndarray) -> None:
        top = int(allocated.max())
        at_top = np.flatnonzero(allocated == top)
        index = int(at_top[np.argmin(iteration[at_top])])
        first = int(iteration[index])
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, int(reserved.max()))
        if top > self.peak_allocated_bytes or (top == self.peak_allocated_bytes and first < self.peak_iteration):
            row = int(rows[index]) if rows is not None else index  # strings are read for this one row only
            self.peak_allocated_bytes, self.peak_iteration = top, first
            self.peak_module = str(batch.column("peak_module")[row].as_py())
            self.peak_phase = str(batch.column("peak_phase")[row].as_py())

    def _add_buckets(self, iteration: np.ndarray, allocated: np.ndarray, reserved: np.ndarray) -> None:
        bucket = (iteration - self.first_iteration) // self.width
        # per bucket, the row with the highest peak and, among equals, the first iteration
        order = np.lexsort((iteration, -allocated, bucket))
        ordered = bucket[order]
        heads = order[np.r_[True, ordered[1:] != ordered[:-1]]]
        where, value, at = bucket[heads], allocated[heads], iteration[heads]
        current, current_at = self.bucket_peak[where], self.bucket_iteration[where]
        better = (value > current) | ((value == current) & (at < current_at))
        self.bucket_peak[where[better]] = value[better]
        self.bucket_iteration[where[better]] = at[better]
        np.maximum.at(self.bucket_reserved, bucket, reserved)


def runs_of(iteration: np.ndarray) -> list[tuple[int, int]]:
    """The distinct values of ``iteration`` as ``(first, last)`` runs of consecutive integers."""
    values = np.unique(iteration)
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


def scan(run_root: Path, plans: list[RankPlan], max_points: int | None) -> dict[int, RankAggregate]:
    """One pass over every planned rank's parts and journal rows; the aggregates by rank.

    Raises:
        RankTraceError: a part cannot be decoded (the message names its rank).
        FileNotFoundError: a part vanished during the pass (the caller plans again).
    """
    aggregates = {plan.rank: RankAggregate.start(plan, max_points) for plan in plans}
    for plan in plans:
        if plan.recovered is not None:
            aggregates[plan.rank].add(plan.recovered)
    files = [str(part) for plan in plans for part in plan.parts]
    if not files:
        return aggregates
    dataset = ds.dataset(files, schema=_SCHEMA, format="parquet", partitioning=_PARTITIONING,
                         partition_base_dir=str(run_root))
    options = ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    batches = dataset.to_batches(columns=list(_SCHEMA.names), batch_size=BATCH_ROWS,
                                 fragment_scan_options=options, **_READ_AHEAD)
    try:
        for batch in batches:
            _fold(aggregates, batch)
    except (OSError, pa.ArrowException) as exc:
        if any(not Path(f).exists() for f in files):
            raise FileNotFoundError(f"a part of {run_root} vanished during the pass ({exc})") from None
        raise _blame(exc, plans) from None
    return aggregates


def _fold(aggregates: dict[int, RankAggregate], batch: pa.RecordBatch) -> None:
    ranks = batch.column("rank").to_numpy()
    if not len(ranks):
        return
    if ranks[0] == ranks[-1] and (ranks == ranks[0]).all():  # the scanner yields one fragment per batch
        aggregates[int(ranks[0])].add(batch)
        return
    for rank in np.unique(ranks).tolist():
        aggregates[int(rank)].add(batch, np.flatnonzero(ranks == rank))


def _blame(exc: Exception, plans: list[RankPlan]) -> TraceError:
    """The error to raise for a part that could not be decoded, naming its rank when the message tells it."""
    for plan in plans:
        bad = next((part for part in plan.parts if str(part) in str(exc)), None)
        if bad is not None:
            return RankTraceError(f"rank {plan.rank} cannot be read: {bad} is damaged ({exc}); fix or move away "
                                  f"{bad.parent.parent} to compare the other ranks", plan.rank)
    return CorruptTraceError(f"a part of the ranks could not be decoded ({exc.__class__.__name__}: {exc})")

