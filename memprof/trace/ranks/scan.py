"""One streaming pass over the ``iterations`` tables of every rank, read as one Parquet dataset.

The parts of all ranks are the fragments of one :mod:`pyarrow.dataset` partitioned on ``rank=<r>``
(Hive style), read one after the other. The pass reads only the numeric columns it aggregates, batch
by batch, into a :class:`RankAggregate` per rank; memory holds up to :data:`FOLD_ROWS` rows of one rank
plus the aggregates. The module and phase at each rank's peak are then read for that one iteration
only, from the parts whose footers say they may hold it: decoding those strings for every row would
double the pass. Iterations still in a rank's journal (a killed or running rank) are folded in like
one more batch. A damaged part is left out, as the single-run reader leaves it out
(:mod:`memprof.trace.ranks.damaged`); a strict pass refuses its rank instead.
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

from memprof.errors import CorruptTraceError, RankTraceError
from memprof.trace.damage import PartDamage
from memprof.trace.ranks.aggregate import NUMERIC_COLUMNS, RankAggregate
from memprof.trace.ranks.damaged import DAMAGED_PAGE, PartDamaged
from memprof.trace.ranks.plan import RANK_FIELD, SCAN_COLUMNS, SCAN_SCHEMA, PartsChanged, RankPlan, plan_rank

__all__ = ["SCAN_COLUMNS", "PartsChanged", "RankPlan", "RankResult", "aggregate_ranks", "plan_rank", "scan"]

_LABELS = ("peak_module", "peak_phase")
_PARTITIONING = ds.partitioning(pa.schema([RANK_FIELD]), flavor="hive")
_FORMAT = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
    page_checksum_verification=True))
_FILESYSTEM = pafs.LocalFileSystem()
#: Rows per batch read from a part.
BATCH_ROWS = 65_536
#: Rows folded at a time (a rank's consecutive batches gathered: 1.5 MB, and the temporaries of folding them).
FOLD_ROWS = 65_536
#: Passes tried when the parts change under the pass (merged away by a compaction): list them again.
ATTEMPTS = 3


@dataclass(frozen=True)
class RankResult:
    """One rank's aggregates and the module and phase at its peak."""

    aggregate: RankAggregate
    peak_module: str
    peak_phase: str


def aggregate_ranks(run_root: Path, found: list[tuple[int, Path]], max_points: int | None,
                    strict: bool = False) -> tuple[list[RankResult], tuple[PartDamage, ...]]:
    """Plans and scans every rank; starts again (up to :data:`ATTEMPTS` times) when the parts change under it,
    and without a part whose pages failed (every time one does: at most once per part).

    Returns:
        Each rank's result, and the damaged parts left out (empty when ``strict``).

    Raises:
        RankTraceError: a rank is unreadable, or (``strict``) has a damaged part (the error names it).
        CorruptTraceError: the parts kept changing during every attempt.
    """
    skipped: dict[Path, str] = {}  # parts whose pages failed in an earlier pass
    changes = 0
    while True:
        try:
            plans = [plan_rank(rank, directory, strict, skipped) for rank, directory in found]
            aggregates = scan(run_root, plans, max_points)
            results = [RankResult(aggregates[plan.rank], *peak_labels(plan, aggregates[plan.rank])) for plan in plans]
            return results, tuple(damage for plan in plans for damage in plan.damage)
        except PartDamaged as exc:
            if strict or exc.part in skipped:
                raise _damaged(exc.rank, exc.part, exc.cause) from None
            skipped[exc.part] = DAMAGED_PAGE  # its rows may be folded in already: the pass starts again
        except PartsChanged as exc:
            changes += 1
            if changes >= ATTEMPTS:
                raise CorruptTraceError(f"the parts of {run_root} changed during {ATTEMPTS} passes ({exc}); read "
                                        "it again once its compaction has finished") from None


def scan(run_root: Path, plans: list[RankPlan], max_points: int | None) -> dict[int, RankAggregate]:
    """One pass over every planned rank's parts and journal rows; the aggregates by rank.

    Raises:
        PartDamaged: a part's pages cannot be decoded.
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
        batches = fragment.to_batches(schema=SCAN_SCHEMA, columns=[*NUMERIC_COLUMNS, "rank"], batch_size=BATCH_ROWS)
        for batch in batches:
            folder.push(batch)
    except (OSError, pa.ArrowException) as exc:
        if not part.exists():
            raise PartsChanged(f"{part} vanished ({exc})") from None
        raise PartDamaged(rank, part, exc) from None


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
        PartDamaged: the part that holds the iteration cannot be decoded.
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
            raise PartDamaged(plan.rank, part, exc) from None


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
