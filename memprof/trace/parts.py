"""A table's Parquet parts: listing them, checking their footers, reading one, and caching both by file identity.

A part is named once and never rewritten in place (written under a hidden name and renamed; a merge writes
a new name), so its path with its modification time and size identifies its content. A caller that opens
the same run again and again (the dashboard following a live run) passes a :class:`PartCache`, and only
the parts that are new since the last opening are checked and read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.errors import CorruptTraceError
from memprof.schema import LATER_COLUMNS, READ_SCHEMAS, V1_DEFAULTS, table_dir_name

#: ``(first, last)`` iteration of a part, from its footer's statistics; ``None`` when it has none.
IterationRange = tuple[int, int] | None
#: Times a table's parts are listed again when a part vanished (a live writer merged it away).
RELIST_ATTEMPTS = 5
#: What a part that is not Parquet at all is said to be (no exception class names: the user cannot act on them).
UNREADABLE = "not a readable Parquet file (truncated, overwritten or written by another tool)"

T = TypeVar("T")


class PartCache(Protocol):
    """Anything with ``get_or_build`` (e.g. :class:`dashboard.cache.BoundedCache`); values must stay unmodified."""

    def get_or_build(self, key: Hashable, build: Callable[[], T]) -> T:
        """Returns the value cached under ``key``, building it on a miss."""


class PartVanished(Exception):
    """A listed part no longer exists: a writer merged it into another part meanwhile."""


@dataclass(frozen=True)
class BadPart:
    """A part whose footer cannot be used, and why (in words; the strict reader raises ``error`` instead)."""

    path: Path
    reason: str
    error: CorruptTraceError


def table_parts(run_dir: Path, table: str) -> list[Path]:
    """Lists the Parquet parts of one table, in write order (hidden temporary files excluded)."""
    directory = Path(run_dir) / table_dir_name(table)
    if directory.is_file():  # a single-file table is accepted too
        return [directory]
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("part-*.parquet") if not p.name.startswith("."))


def defaults(table: str, version: int) -> dict[str, object]:
    """The columns a part of ``table`` may lack, with the value they read as."""
    return {**(V1_DEFAULTS.get(table, {}) if version == 1 else {}), **LATER_COLUMNS.get(table, {})}


def identity(path: Path) -> tuple[str, int, int]:
    """``(path, mtime_ns, size)``: what a cached result of ``path`` is keyed on.

    Raises:
        PartVanished: the file no longer exists.
    """
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise PartVanished(path) from None
    return str(path), stat.st_mtime_ns, stat.st_size


def _cached(cache: PartCache | None, key: Hashable, build: Callable[[], T]) -> T:
    return build() if cache is None else cache.get_or_build(key, build)


def list_parts(run_dir: Path, table: str, version: int, cache: PartCache | None = None
               ) -> tuple[tuple[Path, ...], tuple[IterationRange, ...], tuple[BadPart, ...]]:
    """Lists a table's readable parts with their iteration ranges, and the parts whose footer is unusable.

    Lists again where a part vanished meanwhile (a live writer merged it away).
    """
    for _ in range(RELIST_ATTEMPTS):
        found = table_parts(run_dir, table)
        try:
            checked = [_checked(part, table, version, cache) for part in found]
        except PartVanished:
            continue
        good = [(p, r) for p, r in zip(found, checked) if not isinstance(r, BadPart)]
        bad = tuple(r for r in checked if isinstance(r, BadPart))
        return tuple(p for p, _ in good), tuple(r for _, r in good if not isinstance(r, BadPart)), bad
    raise CorruptTraceError(f"the parts of {table} in {run_dir} kept vanishing while they were listed "
                            f"({RELIST_ATTEMPTS} times); open the trace again")


def _checked(part: Path, table: str, version: int, cache: PartCache | None) -> IterationRange | BadPart:
    def check() -> IterationRange | BadPart:
        return check_part(part, table, version)

    return _cached(cache, ("footer", *identity(part), table, version), check)


def check_part(path: Path, table: str, version: int) -> IterationRange | BadPart:
    """Validates a part's footer; returns the range of iterations it holds, or :class:`BadPart` when unreadable.

    Raises:
        CorruptTraceError: the part is readable Parquet but not a memprof table (columns missing or of the
            wrong type): another tool's file, not damage.
    """
    try:
        metadata = pq.read_metadata(path)
        schema = metadata.schema.to_arrow_schema()
    except FileNotFoundError:
        raise PartVanished(path) from None
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        return BadPart(path, UNREADABLE, CorruptTraceError(
            f"{path} is not a readable Parquet file ({exc.__class__.__name__}: {exc}); it may be truncated"))
    # a readable part of the wrong shape is not damage but another tool's (or a bug's) file: refused
    required = [f for f in READ_SCHEMAS[table] if f.name not in defaults(table, version)]
    missing = [f.name for f in required if f.name not in schema.names]
    if missing:
        raise CorruptTraceError(f"{path} is not a memprof {table} table: missing columns {missing}")
    wrong = [f"{f.name} ({schema.field(f.name).type}, expected {f.type})" for f in required
             if not schema.field(f.name).type.equals(f.type)]
    if wrong:
        raise CorruptTraceError(f"{path} has columns of the wrong type: {', '.join(wrong)}")
    return _iteration_range(metadata, schema.get_field_index("iteration"))


def _iteration_range(metadata: pq.FileMetaData, column: int) -> IterationRange:
    lows, highs = [], []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if metadata.row_group(group).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return (int(min(lows)), int(max(highs))) if lows else None


def read_part(path: Path, table: str, version: int, names: Sequence[str] | None,
              filters: list[tuple[str, str, Any]] | None, cache: PartCache | None = None) -> pd.DataFrame:
    """Reads one part (some columns, some rows), filling in the columns it may lack; cached by file identity.

    Raises:
        PartVanished: the part no longer exists.
        CorruptTraceError: it cannot be read (a damaged page: every page carries a checksum).
    """
    key = ("part", *identity(path), table, version, tuple(names) if names else None, repr(filters))
    return _cached(cache, key, lambda: _read_part(path, table, version, names, filters))


def _read_part(path: Path, table: str, version: int, names: Sequence[str] | None,
               filters: list[tuple[str, str, Any]] | None) -> pd.DataFrame:
    fill = defaults(table, version)
    try:
        read_names = None
        if names:  # a column a part may lack is read only from the parts that have it
            present = set(pq.read_schema(path).names) if fill.keys() & set(names) else set()
            read_names = [c for c in names if c not in fill or c in present]
        data = pq.read_table(path, columns=read_names, filters=filters or None, page_checksum_verification=True)
    except (OSError, pa.ArrowException, KeyError, UnicodeDecodeError) as exc:
        if not path.exists():
            raise PartVanished(path) from None
        raise CorruptTraceError(f"cannot read {path}: {exc}") from None
    frame = data.to_pandas()
    for name, value in fill.items():
        if (names is None or name in names) and name not in frame.columns:
            dtype = READ_SCHEMAS[table].field(name).type.to_pandas_dtype()
            frame[name] = pd.Series([value] * len(frame), dtype=dtype, index=frame.index)
    return frame[list(names)] if names else frame
