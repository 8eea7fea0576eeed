"""Compaction: a table keeps a bounded number of Parquet parts however long the run.

Every flush appends a *tier-0* part. Whenever the last :attr:`~CompactionPolicy.fan_in` (F) parts of a
table have the same tier t, they are merged into one part of tier t + 1, unless their rows or bytes
together exceed the policy's caps: a merge's cost (time and memory) stays bounded, and parts at the cap
stay as they are. With N parts appended to a table holding R rows in B bytes, the table has at most::

    (F - 1) * (floor(log_F N) + 1)  +  F * (R / max_rows + B / max_bytes)

parts: below the caps the parts are the base-F digits of N (at most F - 1 per tier, floor(log_F N) + 1
tiers); past them every further part holds on average more than 1/F of a cap. Each row is rewritten once
per tier it climbs: floor(log_F N) times at most. With the defaults (F = 8) 100,000 iterations flushed 16
at a time (N = 6,250) leave at most 35 parts per table; ``tests/memprof/trace/format/test_compaction.py`` checks
the bound, including past the caps.

Names. A tier-0 part is ``part-<n>.parquet`` (``n`` counts the table's appends); a merged part is
``part-<last>.t<tier>-<first>.parquet`` and holds the tier-0 parts ``first`` to ``last``. Sorted by name,
parts are in write order, which is iteration order: a merged part sorts after each of its inputs (same
``last``, ``.t`` after ``.p``, a higher tier after a lower one) and before every later part.

Merged parts hold the rows of their inputs sorted by iteration (stable: events keep their ``seq`` order);
where an iteration is in several inputs (an inline takeover wrote it again) only the last input's rows
are kept, which is the reader's rule. Row groups of :data:`ROW_GROUP_ROWS` rows carry statistics on
``iteration``, so readers skip row groups as well as whole parts.

Crash rule. A merge writes its part atomically (temporary name, then rename; fsynced first when an
input may already be on disk, so that a merge never makes data less durable) and only then deletes its
inputs. A process killed between the two leaves inputs beside the merged part; they hold the same rows,
and the merged part, sorting after them, wins under the reader's rule (the last part by name that holds
an iteration). A writer opened on the directory deletes such leftovers and stale temporary files.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memprof.atomic import write_atomically

#: Parts merged at once: F in the bound above.
FAN_IN = 8
#: A merge whose inputs hold more rows than this is not done (bounds a merge's memory).
MAX_MERGE_ROWS = 1 << 20
#: A merge whose inputs take more bytes on disk than this is not done (bounds a merge's time).
MAX_MERGE_BYTES = 64 << 20
#: Rows per row group of a merged part: reading one iteration decodes about this many rows.
ROW_GROUP_ROWS = 16_384
#: A merge whose oldest input is older than this fsyncs its part: the input may be on disk already.
WRITEBACK_S = 5.0
#: Tiers are one digit in names so that they sort; F**9 flushes are never reached.
MAX_TIER = 9

_NAME = re.compile(r"part-(\d+)(?:\.t(\d)-(\d+))?\.parquet")


class Part(NamedTuple):
    """One Parquet part of a table, as compaction sees it.

    Attributes:
        path: the file.
        first: the first tier-0 part number it holds.
        last: the last tier-0 part number it holds (equal to ``first`` for a tier-0 part).
        tier: 0 for an appended part, t + 1 for a merge of tier-t parts.
        rows: its rows, or ``None`` when its footer cannot be read (it is then never merged).
        size_bytes: its size on disk.
    """

    path: Path
    first: int
    last: int
    tier: int
    rows: int | None
    size_bytes: int


@dataclass(frozen=True)
class CompactionPolicy:
    """When parts are merged; see the module's docstring for the bound it gives.

    Attributes:
        fan_in: parts of one tier merged together (F).
        max_rows: largest number of rows a merge takes in.
        max_bytes: largest number of bytes (on disk) a merge takes in.
        row_group_rows: rows per row group of a merged part.
    """

    fan_in: int = FAN_IN
    max_rows: int = MAX_MERGE_ROWS
    max_bytes: int = MAX_MERGE_BYTES
    row_group_rows: int = ROW_GROUP_ROWS

    def __post_init__(self) -> None:
        if self.fan_in < 2:
            raise ValueError(f"fan_in must be at least 2 (got {self.fan_in}): merging one part gains nothing")

    def plan(self, parts: Sequence[Part]) -> list[Part] | None:
        """The trailing parts to merge next, or ``None`` when none should be."""
        if len(parts) < self.fan_in:
            return None
        tail = list(parts[-self.fan_in:])
        tier = tail[0].tier
        if tier >= MAX_TIER or any(p.tier != tier for p in tail):
            return None
        if any(p.rows is None for p in tail):
            return None
        if sum(p.rows or 0 for p in tail) > self.max_rows or sum(p.size_bytes for p in tail) > self.max_bytes:
            return None
        return tail


def part_name(first: int, last: int, tier: int) -> str:
    """The file name of a part holding the tier-0 parts ``first`` to ``last``."""
    if tier == 0:
        return f"part-{last:06d}.parquet"
    return f"part-{last:06d}.t{tier}-{first:06d}.parquet"


def parse_part_name(name: str) -> tuple[int, int, int] | None:
    """``(first, last, tier)`` of a part's file name, or ``None`` for a name memprof does not write."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    last = int(match.group(1))
    if match.group(2) is None:
        return last, last, 0
    return int(match.group(3)), last, int(match.group(2))


def open_parts(directory: Path) -> list[Part]:
    """Lists a table's parts in name order after removing what a killed writer left behind.

    Leftovers are the inputs of a merge killed before it deleted them (parts that lie inside a merged
    part's range) and hidden temporary files. Only a writer may call this: nothing else may be writing.
    """
    if not directory.is_dir():
        return []
    for temporary in directory.glob(".part-*.tmp"):
        with contextlib.suppress(OSError):
            temporary.unlink()
    found: list[tuple[Path, tuple[int, int, int]]] = []
    for path in sorted(directory.glob("part-*.parquet")):
        parsed = parse_part_name(path.name)
        if parsed is not None:
            found.append((path, parsed))
    merged = [(first, last, path) for path, (first, last, tier) in found if tier > 0]
    parts = []
    for path, (first, last, tier) in found:
        if any(a <= first and last <= b and path != m for a, b, m in merged):
            with contextlib.suppress(OSError):
                path.unlink()  # its rows are in the merged part, which a reader prefers anyway
            continue
        parts.append(Part(path, first, last, tier, _rows(path), path.stat().st_size))
    return parts


def _rows(path: Path) -> int | None:
    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, pa.ArrowException):
        return None


def merge_parts(inputs: Sequence[Part], row_group_rows: int = ROW_GROUP_ROWS,
                loaded: Mapping[Path, pa.Table] | None = None) -> Part:
    """Merges consecutive parts into one of the next tier, then deletes them.

    Args:
        inputs: parts that follow each other in name order, all of one tier.
        row_group_rows: rows per row group of the merged part.
        loaded: the content of inputs still in memory (the writer's last appends), so that they
            need not be read again: reading small files is most of a merge's cost.

    Raises:
        OSError: an input could not be read or the merged part could not be written; nothing changed.
        pyarrow.ArrowException: an input is damaged; nothing changed.
    """
    loaded = loaded or {}
    tables = [loaded[p.path] if p.path in loaded else pq.ParquetFile(p.path, page_checksum_verification=True).read()
              for p in inputs]
    merged = _sorted_by_iteration(pa.concat_tables(_latest_rows(tables), promote_options="default"))
    sink = pa.BufferOutputStream()
    # Unlike appended parts, merged ones are big enough for dictionaries of their strings (module and
    # phase names) to pay; the numbers barely repeat, and dictionaries make them bigger.
    strings = [f.name for f in merged.schema if pa.types.is_string(f.type)]
    pq.write_table(merged, sink, compression="snappy", write_page_checksum=True, use_dictionary=strings,
                   write_statistics=["iteration"], row_group_size=row_group_rows)
    first, last, tier = inputs[0].first, inputs[-1].last, inputs[0].tier + 1
    path = inputs[0].path.parent / part_name(first, last, tier)
    data = sink.getvalue()
    write_atomically(path, memoryview(data), durable=any(_may_be_on_disk(p.path) for p in inputs))
    for part in inputs:
        with contextlib.suppress(OSError):  # a leftover is harmless: the merged part wins over it
            part.path.unlink()
    return Part(path, first, last, tier, merged.num_rows, data.size)


def _may_be_on_disk(part: Path) -> bool:
    """Whether a part may already have reached the disk: a merge must not replace it by one that has not.

    A merge of parts written moments ago (inline processing merges every few iterations) skips the
    fsync: a power loss would lose those parts anyway.
    """
    try:
        return time.time() - part.stat().st_mtime > WRITEBACK_S
    except OSError:
        return True


def _latest_rows(tables: list[pa.Table]) -> list[pa.Table]:
    """Keeps each iteration's rows from the last table that holds it (the reader's rule)."""
    bounds = [pc.min_max(t.column("iteration")) for t in tables if t.num_rows]
    lows = [b["min"].as_py() for b in bounds]
    highs = [b["max"].as_py() for b in bounds]
    if all(high < low for high, low in zip(highs, lows[1:])):
        return tables  # the usual case: each table's iterations come after the previous one's
    kept: list[pa.Table] = []
    later = pa.array([], pa.int64())
    for table in reversed(tables):
        iterations = table.column("iteration")
        if len(later):
            table = table.filter(pc.invert(pc.is_in(iterations, value_set=later)))
        kept.append(table)
        later = pa.concat_arrays([later, pc.unique(iterations)])
    return kept[::-1]


def _sorted_by_iteration(table: pa.Table) -> pa.Table:
    iterations = table.column("iteration")
    if table.num_rows < 2 or pc.all(pc.greater_equal(iterations[1:], iterations[:-1])).as_py():
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("iteration", "ascending")]))  # a stable sort
