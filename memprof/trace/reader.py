"""Reading run directories: the one way every other part of the project reads a trace."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.analysis.iteration import ProcessedIteration
from memprof.analysis.op_records import OpRecord
from memprof.errors import CorruptTraceError, SchemaVersionError, TraceError, TraceNotFoundError
from memprof.schema import (
    FORMAT_NAME,
    ITERATIONS,
    LATER_COLUMNS,
    META_FILE,
    META_KEYS,
    OPS,
    OPTIONAL_TABLES,
    READ_SCHEMAS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    TABLES,
    V1_DEFAULTS,
    table_dir_name,
)
from memprof.trace.ops_table import records_from_frame
from memprof.trace.recovery import recover, recovered_frame

#: ``(first, last)`` iteration of a part, from its footer's statistics; ``None`` when it has none.
IterationRange = tuple[int, int] | None
#: Times a table's parts are listed again when a part vanished (a live writer merged it away).
_RELIST_ATTEMPTS = 5


class _PartVanished(Exception):
    """A listed part no longer exists: a writer merged it into another part meanwhile."""


def read_meta(run_dir: Path) -> dict[str, Any]:
    """Reads and validates ``meta.json`` of a run directory.

    Raises:
        TraceNotFoundError: the directory or its ``meta.json`` is missing.
        CorruptTraceError: the file is not JSON or not a memprof trace.
        SchemaVersionError: the schema version is not one this reader knows.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceNotFoundError(f"no trace directory at {run_dir}: expected a run directory written by memprof")
    path = run_dir / META_FILE
    if not path.is_file():
        hint = ""
        if any(run_dir.glob("rank=*")):
            hint = f"; it holds per-rank traces, open one of {sorted(p.name for p in run_dir.glob('rank=*'))}"
        raise TraceNotFoundError(f"{run_dir} has no {META_FILE}: expected a memprof run directory{hint}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptTraceError(f"{path} is not valid JSON ({exc}); expected memprof trace metadata") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CorruptTraceError(f"{path} is not memprof metadata: expected format {FORMAT_NAME!r}, found {found!r}")
    version = meta.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise SchemaVersionError(
            f"{path} has schema_version {version!r}; this memprof reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
            + (": upgrade memprof to read it" if isinstance(version, int) and version > SCHEMA_VERSION else "")
        )
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CorruptTraceError(f"{path} lacks required keys {missing}")
    return meta


def table_parts(run_dir: Path, table: str) -> list[Path]:
    """Lists the Parquet parts of one table, in write order (hidden temporary files excluded)."""
    directory = Path(run_dir) / table_dir_name(table)
    if directory.is_file():  # a single-file table is accepted too
        return [directory]
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("part-*.parquet") if not p.name.startswith("."))


def _required(table: str, version: int) -> list[pa.Field]:
    """The columns a part of ``table`` must have in a trace of schema ``version``."""
    return [f for f in READ_SCHEMAS[table] if f.name not in _defaults(table, version)]


def _defaults(table: str, version: int) -> dict[str, object]:
    """The columns a part of ``table`` may lack, with the value they read as."""
    return {**(V1_DEFAULTS.get(table, {}) if version == 1 else {}), **LATER_COLUMNS.get(table, {})}


def _list_parts(run_dir: Path, table: str, version: int) -> tuple[tuple[Path, ...], tuple[IterationRange, ...]]:
    """Lists a table's parts and checks their footers; lists again where a part vanished meanwhile."""
    for _ in range(_RELIST_ATTEMPTS):
        found = table_parts(run_dir, table)
        try:
            return tuple(found), tuple(_check_part(part, table, version) for part in found)
        except CorruptTraceError:
            if all(part.exists() for part in found):
                raise
    raise CorruptTraceError(f"the parts of {table} in {run_dir} kept vanishing while they were listed "
                            f"({_RELIST_ATTEMPTS} times); open the trace again")


def _check_part(path: Path, table: str, version: int) -> IterationRange:
    """Validates a part's footer; returns the range of iterations it holds."""
    try:
        metadata = pq.read_metadata(path)
        schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        raise CorruptTraceError(
            f"{path} is not a readable Parquet file ({exc.__class__.__name__}: {exc}); it may be truncated"
        ) from None
    required = _required(table, version)
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


@dataclass(frozen=True)
class Trace:
    """One profiled run: its metadata and three tables, read lazily and cached.

    The ``iterations`` table has a row for every recorded iteration; ``layers`` and ``events`` (the
    detail) hold rows only for the iterations in :attr:`detail_iterations`. Read the detail of a few
    iterations with ``read(table, iterations=[...])``: only the parts that hold them are opened.

    Attributes:
        path: the run directory.
        meta: the contents of ``meta.json``.
    """

    path: Path
    meta: dict[str, Any]
    _parts: dict[str, tuple[Path, ...]] = field(repr=False)
    _recovered: list[ProcessedIteration] = field(default_factory=list, repr=False)
    _ranges: dict[str, tuple[IterationRange, ...]] = field(default_factory=dict, repr=False)
    # per table listed again since load_trace: the last iteration of the first listing, beyond which
    # rows written since are not returned (the trace stays the snapshot load_trace took)
    _snapshot_last: dict[str, int | None] = field(default_factory=dict, repr=False)

    def read(self, table: str, columns: Sequence[str] | None = None,
             iterations: Iterable[int] | None = None) -> pd.DataFrame:
        """Reads one table (all parts), optionally only some columns and some iterations.

        Args:
            table: ``"iterations"``, ``"layers"``, ``"events"`` or ``"ops"`` (empty when no planning pass ran).
            columns: the columns to read (default: all).
            iterations: read only these iterations' rows (default: all); parts and row groups that
                cannot hold them are skipped.

        Raises:
            CorruptTraceError: a part cannot be read or lacks a requested column.
        """
        if table not in READ_SCHEMAS:
            raise KeyError(f"unknown table {table!r}; expected one of {(*TABLES, *OPTIONAL_TABLES)}")
        wanted = None if iterations is None else sorted({int(i) for i in iterations})
        if columns is not None and "iteration" not in columns:
            # the iteration column tells which of two parts holding an iteration wins
            frame = self.read(table, ["iteration", *columns], wanted)
            return frame[list(columns)]
        frame = self._read_parts(table, columns, wanted)
        if table == OPS:
            # written whole, by the recording process itself, before its iteration's row: kept as it is
            return frame
        if table != ITERATIONS and "iteration" in frame.columns and self._parts[ITERATIONS]:
            # a run killed between an iteration's parts wrote layers/events but not its row: drop them
            frame = frame[frame.iteration.isin(self._written_iterations)].reset_index(drop=True)
        recovered = recovered_frame(self._recovered, table)
        if recovered is not None:  # iterations still in the journal of a killed or running run
            keep = ~recovered.iteration.isin(self._written_iterations)
            if wanted is not None:
                keep &= recovered.iteration.isin(wanted)
            recovered = recovered[keep]
            if columns:
                recovered = recovered[[c for c in columns if c in recovered.columns]]
            if len(recovered):
                frame = pd.concat([frame, recovered], ignore_index=True) if len(frame) else recovered
                frame = frame.reset_index(drop=True)
        return frame

    @cached_property
    def _written_iterations(self) -> set[int]:
        if not self._parts[ITERATIONS]:
            return set()
        return set(self._read_parts(ITERATIONS, ["iteration"], None).iteration.tolist())

    @property
    def version(self) -> int:
        """The trace's schema version."""
        return int(self.meta["schema_version"])

    def _read_parts(self, table: str, columns: Sequence[str] | None, wanted: list[int] | None) -> pd.DataFrame:
        for _ in range(_RELIST_ATTEMPTS):
            try:
                return self._read_listed(table, columns, wanted)
            except _PartVanished:
                self._relist(table)
        raise CorruptTraceError(f"the parts of {table} in {self.path} kept vanishing while they were read "
                                f"({_RELIST_ATTEMPTS} times); open the trace again")

    def _relist(self, table: str) -> None:
        """Lists a table's parts again after a live writer merged some of those listed away."""
        if table not in self._snapshot_last:
            ranges = self._ranges.get(table, ())
            known = all(r is not None for r in ranges) and bool(ranges)
            self._snapshot_last[table] = max(r[1] for r in ranges if r is not None) if known else None
        self._parts[table], self._ranges[table] = _list_parts(self.path, table, self.version)

    def _read_listed(self, table: str, columns: Sequence[str] | None, wanted: list[int] | None) -> pd.DataFrame:
        parts = self._parts[table]
        if wanted is not None:
            ranges = self._ranges.get(table) or (None,) * len(parts)
            parts = tuple(p for p, r in zip(parts, ranges) if _may_hold(r, wanted))
        if not parts:
            return _empty_frame(table, columns)
        defaults = _defaults(table, self.version)
        names = list(columns) if columns else None
        filters: list[tuple[str, str, Any]] = [("iteration", "in", wanted)] if wanted is not None else []
        if self._snapshot_last.get(table) is not None:
            filters.append(("iteration", "<=", self._snapshot_last[table]))
        frames = []
        for part in parts:
            try:
                read_names = None
                if names:  # a column a part may lack is read only from the parts that have it
                    present = set(pq.read_schema(part).names) if defaults.keys() & set(names) else set()
                    read_names = [c for c in names if c not in defaults or c in present]
                data = pq.read_table(part, columns=read_names, filters=filters or None,
                                     page_checksum_verification=True)
            except (OSError, pa.ArrowException, KeyError, UnicodeDecodeError) as exc:
                if not part.exists():
                    raise _PartVanished(part) from None
                raise CorruptTraceError(f"cannot read {part}: {exc}") from None
            frame = data.to_pandas()
            for name, value in defaults.items():
                if (names is None or name in names) and name not in frame.columns:
                    dtype = READ_SCHEMAS[table].field(name).type.to_pandas_dtype()
                    frame[name] = pd.Series([value] * len(frame), dtype=dtype, index=frame.index)
            frames.append(frame[names] if names else frame)
        if len(frames) == 1:
            return frames[0]
        return pd.concat(_latest_parts_only(frames), ignore_index=True)

    @cached_property
    def iterations(self) -> pd.DataFrame:
        """One row per recorded iteration."""
        return self.read(ITERATIONS)

    @cached_property
    def detail_iterations(self) -> list[int]:
        """The iterations whose detail (layers and events rows) the trace holds, in order."""
        frame = self.read(ITERATIONS, columns=["iteration", "detail"])
        return sorted(int(i) for i in frame.iteration[frame.detail.astype(bool)])

    @cached_property
    def layers(self) -> pd.DataFrame:
        """One row per detailed iteration and module."""
        return self.read("layers")

    @cached_property
    def events(self) -> pd.DataFrame:
        """The memory timeline of the detailed iterations: one row per hook event."""
        return self.read("events")

    @cached_property
    def op_iterations(self) -> list[int]:
        """The iterations whose ops a planning pass recorded (the ``ops`` table), in order; usually one."""
        return sorted(int(i) for i in pd.unique(self.read(OPS, columns=["iteration"]).iteration))

    def op_records(self, iteration: int | None = None) -> list[OpRecord]:
        """The aten ops of one recorded forward, in dispatch order (see :class:`OpRecord`).

        Args:
            iteration: the iteration whose ops to return (default: the first in :attr:`op_iterations`).

        Returns:
            The records, or an empty list when the trace has no ops for that iteration (no planning pass
            ran, or the trace predates the ``ops`` table).

        Raises:
            CorruptTraceError: the table cannot be read, or holds a row that is not a valid record.
        """
        if iteration is None:
            if not self.op_iterations:
                return []
            iteration = self.op_iterations[0]
        frame = self.read(OPS, iterations=[int(iteration)])
        return records_from_frame(frame[frame.iteration == int(iteration)])

    @property
    def run_id(self) -> str:
        """The run's identifier."""
        return str(self.meta["run_id"])


def _may_hold(found: IterationRange, wanted: list[int]) -> bool:
    if found is None:
        return True
    low, high = found
    return any(low <= i <= high for i in wanted)


def _latest_parts_only(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Where an iteration appears in several parts, keeps only its rows of the last one.

    That happens when a background worker died after writing some parts of a batch: the profiler
    then writes those iterations again, whole; and while a merge has written its part but not yet
    deleted its inputs (or was killed then), the merged part sorting after them
    (:mod:`memprof.trace.compaction`).
    """
    if not all("iteration" in f.columns for f in frames):
        return frames
    owner: dict[int, int] = {}
    repeated = False
    for index, frame in enumerate(frames):
        for iteration in pd.unique(frame.iteration).tolist():
            repeated |= iteration in owner
            owner[iteration] = index
    if not repeated:
        return frames
    return [f[f.iteration.map(owner) == i] for i, f in enumerate(frames)]


def _empty_frame(table: str, columns: Iterable[str] | None) -> pd.DataFrame:
    schema = READ_SCHEMAS[table]
    names = list(columns) if columns else schema.names
    return schema.empty_table().select([n for n in names if n in schema.names]).to_pandas()


def load_trace(run_dir: str | Path) -> Trace:
    """Opens a run directory written by :class:`memprof.MemoryProfiler`.

    Metadata and every Parquet footer are validated now; table data is read on first access. The
    trace is a snapshot of the run as it was then: should a live writer merge parts away before they
    are read (:mod:`memprof.trace.compaction`), the table's parts are listed again and only the
    iterations of the snapshot are returned.

    Raises:
        TraceNotFoundError: the directory or its metadata is missing.
        CorruptTraceError: a file is damaged, truncated or written by another tool.
        SchemaVersionError: the trace's schema version is unknown to this reader.
    """
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    # the journal first, the parts second: what a live worker writes meanwhile is then in the parts
    recovered = recover(run_dir)
    parts: dict[str, tuple[Path, ...]] = {}
    ranges: dict[str, tuple[IterationRange, ...]] = {}
    version = int(meta["schema_version"])
    for table in (*TABLES, *OPTIONAL_TABLES):
        parts[table], ranges[table] = _list_parts(run_dir, table, version)
    return Trace(path=run_dir, meta=meta, _parts=parts, _recovered=recovered, _ranges=ranges)


@dataclass(frozen=True)
class RunEntry:
    """A run (or one rank of a distributed run) found under a traces folder.

    Attributes:
        path: the directory that ``load_trace`` opens.
        name: the path relative to the traces folder, e.g. ``"mlp-2026..."`` or ``"ddp/rank=1"``.
        meta: the validated metadata, or ``None`` when the run could not be read.
        error: why the run could not be read, or ``None``.
    """

    path: Path
    name: str
    meta: dict[str, Any] | None
    error: str | None


def list_runs(traces_dir: str | Path) -> list[RunEntry]:
    """Finds every run under ``traces_dir`` (one level, plus ``rank=<r>`` subdirectories).

    Unreadable runs are listed with their error instead of raising, so one bad run does not hide
    the others.
    """
    root = Path(traces_dir)
    if not root.is_dir():
        raise TraceNotFoundError(f"no traces folder at {root}")
    entries: list[RunEntry] = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        ranks = sorted(p for p in child.glob("rank=*") if p.is_dir())
        for run_dir in ranks or [child]:
            name = run_dir.relative_to(root).as_posix()
            try:
                entries.append(RunEntry(run_dir, name, read_meta(run_dir), None))
            except TraceError as exc:
                entries.append(RunEntry(run_dir, name, None, str(exc)))
    return entries
