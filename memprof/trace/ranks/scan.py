"""One streaming pass over the ``iterations`` tables of every rank, read as one Parquet dataset.

The parts of all ranks are the fragments of one :mod:`pyarrow.dataset` partitioned on ``rank=<r>``
(Hive style), read one after the other. The pass reads only the numeric columns it aggregates, batch
by batch, into a :class:`RankAggregate` per rank; memory holds up to :data:`FOLD_ROWS` rows of one rank
plus the aggregates. The module and phase at each rank's peak are then read for that one iteration
only, from the parts whose footers say they may hold it: decoding those strings for every row would
double the pass. Iterations still in a rank's journal (a killed or running rank) are folded in like
one more batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memprof.errors import CorruptTraceError, RankTraceError, TraceError
from memprof.schema import ITERATIONS, ITERATIONS_SCHEMA
from memprof.trace.pipeline.recovery import recover, recovered_frame
from memprof.trace.ranks.aggregate import NUMERIC_COLUMNS, RankAggregate
from memprof.trace.reader import read_meta, table_parts

#: The columns of ``iterations`` a rank's summary needs.
SCAN_COLUMNS: tuple[str, ...] = (*NUMERIC_COLUMNS, "peak_module", "peak_phase")
_LABELS = ("peak_module", "peak_phase")
_RANK = pa.field("rank", pa.int64())
_SCHEMA = pa.schema([*(ITERATIONS_SCHEMA.field(name) for name in SCAN_COLUMNS), _RANK])
_PARTITIONING = ds.partitioning(pa.schema([_RANK]), flavor="hive")
_FORMAT = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
    page_checksum_verification=True))
_FILESYSTEM = pafs.LocalFileSystem()
#: Rows per batch read from a part.
BATCH_ROWS = 65_536
#: Rows folded at a time (a rank's consecutive batches gathered: 1.5 MB, and the temporaries of folding them).
FOLD_ROWS = 65_536
#: Passes tried when the parts change under the pass (merged away by a compaction): list them again.
ATTEMPTS = 3

Span = tuple[int, int] | None  # (first, last) iteration of a part; None when it is empty


class PartsChanged(Exception):
    """A part vanished or held other iterations than its footer said: the parts changed during the pass."""


@dataclass(frozen=True)
class RankPlan:
    """What a pass reads of one rank.

    Attributes:
        rank: the rank.
        parts: the ``iterations`` parts, in write order, and the span of iterations each holds.
        recovered: rows of iterations still in the rank's journal (``None`` without any).
    """

    rank: int
    parts: tuple[tuple[Path, Span], ...]
    recovered: pa.RecordBatch | None

    def span(self) -> tuple[int | None, int | None]:
        """The first and last iteration of the rank (``None, None`` when it has none)."""
        spans = [span for _, span in self.parts if span is not None]
        if self.recovered is not None:
            found = pc.min_max(self.recovered.column("iteration")).as_py()
            spans.append((found["min"], found["max"]))
        return min((s[0] for s in spans), default=None), max((s[1] for s in spans), default=None)


@dataclass(frozen=True)
class RankResult:
    """One rank's aggregates and the module and phase at its peak."""

    aggregate: RankAggregate
    peak_module: str
    peak_phase: str


def plan_rank(rank: int, directory: Path) -> RankPlan:
    """Validates one rank's metadata and ``iterations`` footers; reads its journal's iterations.

    Raises:
        RankTraceError: the rank's metadata, a part's footer or its journal cannot be read.
    """
    try:
        read_meta(directory)
        parts = tuple((part, _part_span(part)) for part in table_parts(directory, ITERATIONS))
        frame = recovered_frame(recover(directory), ITERATIONS)
    except (TraceError, OSError) as exc:
        raise RankTraceError(f"rank {rank} of {directory.parent} cannot be read: {exc}; fix or move away "
                             f"{directory} to compare the other ranks", rank) from exc
    recovered = None
    if frame is not None and len(frame):
        recovered = pa.RecordBatch.from_pandas(frame[list(SCAN_COLUMNS)].assign(rank=rank), schema=_SCHEMA,
                                               preserve_index=False)
    return RankPlan(rank, parts, recovered)


def _part_span(part: Path) -> Span:
    """The span of iterations of a part, from its footer; checks the types of the scanned columns."""
    try:
        metadata = pq.read_metadata(part)
        schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        raise CorruptTraceError(f"{part} is not a readable Parquet file ({exc}); it may be truncated") from None
    wrong = [f"{field.name} ({field.type})" for field in _SCHEMA if field.name != "rank"
             and (field.name not in schema.names or not schema.field(field.name).type.equals(field.type))]
    if wrong:
        raise CorruptTraceError(f"{part} is not a memprof iterations table: expected columns {', '.join(wrong)}")
    column = schema.get_field_index("iteration")
    lows, highs = [], []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        stats = group.column(column).statistics
        if group.num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:  # written without statistics (another tool): read the column
            found = pc.min_max(pq.read_table(part, columns=["iteration"]).column(0)).as_py()
            return None if found["min"] is None else (found["min"], found["max"])
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else None


def aggregate_ranks(run_root: Path, found: list[tuple[int, Path]], max_points: int | None) -> list[RankResult]:
    """Plans and scans every rank; starts again (up to :data:`ATTEMPTS` times) when the parts change under it.

    Raises:
        RankTraceError: a rank is unreadable (the error names it).
        CorruptTraceError: the parts kept changing during every attempt.
    """
    for _ in range(ATTEMPTS):
        plans = [plan_rank(rank, directory) for rank, directory in found]
        try:
            aggregates = scan(run_root, plans, max_points)
            return [RankResult(aggregates[plan.rank], *peak_labels(plan, aggregates[plan.rank])) for plan in plans]
        except PartsChanged as exc:
            changed = exc
    raise CorruptTraceError(f"the parts of {run_root} changed during {ATTEMPTS} passes ({changed}); read it again "
                            "once its compaction has finished")


def scan(run_root: Path, plans: list[RankPlan], max_points: int | None) -> dict[int, RankAggregate]:
    """One pass over every planned rank's parts and journal rows; the aggregates by rank.

    Raises:
        RankTraceError: a part cannot be decoded (the message names its rank).
        PartsChanged: a part vanished, or held iterations outside its footer's span, during the pass.
    """
    aggregates = {plan.rank: RankAggregate.start(plan.rank, *plan.span(), max_points) for plan in plans}
    folder = _Folder(aggregates)
    try:
        for plan in plans:
            if plan.recovered is not None:
                aggregates[plan.rank].add_batch(plan.recovered)
            for part, _ in plan.parts:
                _scan_part(run_root, part, plan.rank, folder)
        folder.flush()
    except IndexError as exc:
        raise PartsChanged(str(exc)) from None
    return aggregates


def _scan_part(run_root: Path, part: Path, rank: int, folder: _Folder) -> None:
    """Folds one part: a fragment of the Hive-partitioned dataset, its ``rank`` read from the ``rank=<r>`` folder.

    Each fragment is made, read and dropped in turn: a ``FileSystemDataset`` of every part keeps each
    fragment's decoded footer once read, memory that grows with the number of parts.
    """
    where = _PARTITIONING.parse("/" + part.relative_to(run_root).as_posix())
    fragment = _FORMAT.make_fragment(str(part), _FILESYSTEM, partition_expression=where)
    try:
        for batch in fragment.to_batches(schema=_SCHEMA, columns=[*NUMERIC_COLUMNS, "rank"], batch_size=BATCH_ROWS):
            folder.push(batch)
    except (OSError, pa.ArrowException) as exc:
        if not part.exists():
            raise PartsChanged(f"{part} vanished ({exc})") from None
        raise _damaged(rank, part, exc) from None


class _Folder:
    """Gathers consecutive batches of one rank into blocks of up to :data:`FOLD_ROWS` rows, then folds each.

    The scanner yields a batch per part; folding a small part costs as much numpy overhead as a large
    one, so a rank's parts are folded a block at a time.
    """

    def __init__(self, aggregates: dict[int, RankAggregate]) -> None:
        self.aggregates = aggregates
        self.rank: int | None = None
        self.pending: list[list[np.ndarray]] = []
        self.rows = 0

    def push(self, batch: pa.RecordBatch) -> None:
        ranks = batch.column("rank").to_numpy()
        if not len(ranks):
            return
        columns = [batch.column(name).to_numpy() for name in NUMERIC_COLUMNS]
        if ranks[0] == ranks[-1] and (ranks == ranks[0]).all():  # a batch comes from one part: one rank
            self._gather(int(ranks[0]), columns)
            return
        for rank in np.unique(ranks).tolist():
            rows = np.flatnonzero(ranks == rank)
            self._gather(int(rank), [column[rows] for column in columns])

    def _gather(self, rank: int, columns: list[np.ndarray]) -> None:
        if rank != self.rank or self.rows + len(columns[0]) > FOLD_ROWS:
            self.flush()
        self.rank = rank
        self.pending.append(columns)
        self.rows += len(columns[0])

    def flush(self) -> None:
        """Folds the gathered rows into their rank's aggregates."""
        if self.rank is not None and self.pending:
            self.aggregates[self.rank].add(*(np.concatenate(parts) for parts in zip(*self.pending)))
        self.pending, self.rows = [], 0


def peak_labels(plan: RankPlan, aggregate: RankAggregate) -> tuple[str, str]:
    """The ``peak_module`` and ``peak_phase`` at the rank's peak, read for that iteration only.

    Raises:
        RankTraceError: the part that holds the iteration cannot be decoded.
        PartsChanged: no part holds the iteration any more.
    """
    if not aggregate.intervals:
        return "", ""
    for rows in _rows_of(plan, aggregate.peak_iteration):
        if rows.num_rows:
            module, phase = (str(rows.column(name)[0].as_py()) for name in _LABELS)
            return module, phase
    raise PartsChanged(f"no part of rank {plan.rank} holds iteration {aggregate.peak_iteration} any more")


def _rows_of(plan: RankPlan, iteration: int) -> Iterator[pa.Table | pa.RecordBatch]:
    """The rows of ``iteration`` in the journal, then in each part that may hold it, the last part first."""
    if plan.recovered is not None:
        yield plan.recovered.filter(pc.equal(plan.recovered.column("iteration"), iteration))
    for part, span in reversed(plan.parts):  # the reader keeps an iteration's copy in the last part
        if span is not None and not span[0] <= iteration <= span[1]:
            continue
        try:
            yield from _row_groups_holding(part, iteration)
        except (OSError, pa.ArrowException) as exc:
            if not part.exists():
                raise PartsChanged(f"{part} vanished ({exc})") from None
            raise _damaged(plan.rank, part, exc) from None


def _row_groups_holding(part: Path, iteration: int) -> Iterator[pa.Table]:
    """The rows of ``iteration`` in each row group of ``part`` whose statistics say it may hold it."""
    reader = pq.ParquetFile(part, page_checksum_verification=True)
    column = reader.schema_arrow.get_field_index("iteration")
    for index in range(reader.metadata.num_row_groups):
        stats = reader.metadata.row_group(index).column(column).statistics
        if stats is not None and stats.has_min_max and not stats.min <= iteration <= stats.max:
            continue
        rows = reader.read_row_group(index, columns=["iteration", *_LABELS], use_threads=False)
        yield rows.filter(pc.equal(rows.column("iteration"), iteration))


def _damaged(rank: int, part: Path, exc: Exception) -> RankTraceError:
    return RankTraceError(f"rank {rank} cannot be read: {part} is damaged ({exc}); fix or move away "
                          f"{part.parent.parent} to compare the other ranks", rank)
