"""What the ranks' pass reads of one rank: its ``iterations`` parts with their spans, and its journal's rows.

Planning reads each rank's metadata and the footers of its parts (never their rows): a part of the wrong shape
refuses the rank, a part whose footer cannot be read is left out (:mod:`memprof.trace.ranks.damaged`), unless
the pass is strict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memprof.errors import CorruptTraceError, RankTraceError, TraceError
from memprof.schema import ITERATIONS, ITERATIONS_SCHEMA
from memprof.trace.damage import PartDamage
from memprof.trace.parts import UNREADABLE
from memprof.trace.pipeline.recovery import recover, recovered_frame
from memprof.trace.ranks.aggregate import NUMERIC_COLUMNS
from memprof.trace.ranks.damaged import Span, last_iteration, rank_damage
from memprof.trace.reader import read_meta, table_parts

#: The columns of ``iterations`` a rank's summary needs.
SCAN_COLUMNS: tuple[str, ...] = (*NUMERIC_COLUMNS, "peak_module", "peak_phase")
#: The ``rank`` column, read from the ``rank=<r>`` folder names.
RANK_FIELD = pa.field("rank", pa.int64())
#: What the pass reads of a part, with the rank.
SCAN_SCHEMA = pa.schema([*(ITERATIONS_SCHEMA.field(name) for name in SCAN_COLUMNS), RANK_FIELD])


class PartsChanged(Exception):
    """A part vanished or held other iterations than its footer said: the parts changed during the pass."""


class _UnreadableFooter(CorruptTraceError):
    """A part's footer cannot be read (damage: skipped unless strict), unlike a readable part of the wrong shape."""


@dataclass(frozen=True)
class RankPlan:
    """What a pass reads of one rank.

    Attributes:
        rank: the rank.
        parts: the ``iterations`` parts, in write order, and the span of iterations each holds.
        recovered: rows of iterations still in the rank's journal (``None`` without any).
        damage: the damaged parts left out, with the iterations they cost.
    """

    rank: int
    parts: tuple[tuple[Path, Span], ...]
    recovered: pa.RecordBatch | None
    damage: tuple[PartDamage, ...] = ()

    def span(self) -> tuple[int | None, int | None]:
        """The first and last iteration of the rank (``None, None`` when it has none)."""
        spans = [span for _, span in self.parts if span is not None]
        if self.recovered is not None:
            found = pc.min_max(self.recovered.column("iteration")).as_py()
            spans.append((found["min"], found["max"]))
        return min((s[0] for s in spans), default=None), max((s[1] for s in spans), default=None)


def plan_rank(rank: int, directory: Path, strict: bool = False,
              skipped: Mapping[Path, str] | None = None) -> RankPlan:
    """Validates one rank's metadata and ``iterations`` footers; reads its journal's iterations.

    Args:
        rank: the rank.
        directory: its ``rank=<r>`` folder.
        strict: refuse the rank at a part whose footer cannot be read, instead of leaving the part out.
        skipped: parts found damaged by an earlier pass (their pages failed), left out with the reason.

    Raises:
        RankTraceError: the rank's metadata or a part of the wrong shape (or, ``strict``, an unreadable
            footer) cannot be read.
    """
    skipped = dict(skipped or {})
    try:
        meta = read_meta(directory)
        listed = table_parts(directory, ITERATIONS)
        spans = [_span_or_skip(part, strict, skipped) for part in listed]
        frame = recovered_frame(recover(directory), ITERATIONS)
    except (TraceError, OSError) as exc:
        raise RankTraceError(f"rank {rank} of {directory.parent} cannot be read: {exc}; fix or move away "
                             f"{directory} to compare the other ranks", rank) from exc
    recovered = None
    journaled: frozenset[int] = frozenset()
    if frame is not None and len(frame):
        recovered = pa.RecordBatch.from_pandas(frame[list(SCAN_COLUMNS)].assign(rank=rank), schema=SCAN_SCHEMA,
                                               preserve_index=False)
        journaled = frozenset(int(i) for i in frame["iteration"])
    parts = tuple((part, span) for part, span in zip(listed, spans) if part not in skipped)
    damage: tuple[PartDamage, ...] = ()
    if skipped:
        last = last_iteration(spans, max(journaled, default=None), meta)
        damage = rank_damage(directory.parent, listed, spans, skipped, last, journaled)
    return RankPlan(rank, parts, recovered, damage)


def _span_or_skip(part: Path, strict: bool, skipped: dict[Path, str]) -> Span:
    """The part's span; a part whose footer cannot be read joins ``skipped`` (``strict``: is refused)."""
    try:
        return _part_span(part)
    except _UnreadableFooter:
        if strict:
            raise
        skipped[part] = UNREADABLE
        return None


def _part_span(part: Path) -> Span:
    """The span of iterations of a part, from its footer; checks the types of the scanned columns."""
    try:
        metadata = pq.read_metadata(part)
        schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        if not part.exists():
            raise PartsChanged(f"{part} vanished ({exc})") from None
        raise _UnreadableFooter(f"{part} is not a readable Parquet file ({exc}); it may be truncated") from None
    wrong = [f"{field.name} ({field.type})" for field in SCAN_SCHEMA if field.name != "rank"
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
            try:
                found = pc.min_max(pq.read_table(part, columns=["iteration"]).column(0)).as_py()
            except (OSError, pa.ArrowException) as exc:
                raise _UnreadableFooter(f"{part}'s iterations cannot be read ({exc})") from None
            return None if found["min"] is None else (found["min"], found["max"])
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else None
