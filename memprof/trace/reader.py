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
from memprof.errors import CorruptTraceError, SchemaVersionError, TraceError, TraceNotFoundError
from memprof.trace.recovery import recover, recovered_frame
from memprof.trace.schema import (
    FORMAT_NAME,
    META_FILE,
    META_KEYS,
    SCHEMA_VERSION,
    SCHEMAS,
    TABLES,
    table_dir_name,
)


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
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path} has schema_version {version!r}; this memprof reads version {SCHEMA_VERSION}"
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


def _check_part(path: Path, table: str) -> None:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        raise CorruptTraceError(
            f"{path} is not a readable Parquet file ({exc.__class__.__name__}: {exc}); it may be truncated"
        ) from None
    missing = [name for name in SCHEMAS[table].names if name not in schema.names]
    if missing:
        raise CorruptTraceError(f"{path} is not a memprof {table} table: missing columns {missing}")
    wrong = [f"{f.name} ({schema.field(f.name).type}, expected {f.type})" for f in SCHEMAS[table]
             if not schema.field(f.name).type.equals(f.type)]
    if wrong:
        raise CorruptTraceError(f"{path} has columns of the wrong type: {', '.join(wrong)}")


@dataclass(frozen=True)
class Trace:
    """One profiled run: its metadata and three tables, read lazily and cached.

    Attributes:
        path: the run directory.
        meta: the contents of ``meta.json``.
    """

    path: Path
    meta: dict[str, Any]
    _parts: dict[str, tuple[Path, ...]] = field(repr=False)
    _recovered: list[ProcessedIteration] = field(default_factory=list, repr=False)

    def read(self, table: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Reads one table (all parts), optionally only some columns.

        Raises:
            CorruptTraceError: a part cannot be read or lacks a requested column.
        """
        if table not in SCHEMAS:
            raise KeyError(f"unknown table {table!r}; expected one of {TABLES}")
        frame = self._read_parts(table, columns)
        if table != "iterations" and "iteration" in frame.columns and self._parts["iterations"]:
            # a run killed between an iteration's parts wrote layers/events but not its row: drop them
            frame = frame[frame.iteration.isin(self._written_iterations)].reset_index(drop=True)
        recovered = recovered_frame(self._recovered, table)
        if recovered is not None:  # iterations still in the journal of a killed or running run
            recovered = recovered[~recovered.iteration.isin(self._written_iterations)]
            if columns:
                recovered = recovered[[c for c in columns if c in recovered.columns]]
            frame = pd.concat([frame, recovered], ignore_index=True) if len(frame) else recovered.reset_index(drop=True)
        return frame

    @cached_property
    def _written_iterations(self) -> set[int]:
        if not self._parts["iterations"]:
            return set()
        return set(self._read_parts("iterations", ["iteration"]).iteration.tolist())

    def _read_parts(self, table: str, columns: Sequence[str] | None) -> pd.DataFrame:
        parts = self._parts[table]
        if not parts:
            return _empty_frame(table, columns)
        frames = []
        for part in parts:
            try:
                frames.append(pq.read_table(part, columns=list(columns) if columns else None,
                                            page_checksum_verification=True).to_pandas())
            except (OSError, pa.ArrowException, KeyError, UnicodeDecodeError) as exc:
                raise CorruptTraceError(f"cannot read {part}: {exc}") from None
        if len(frames) == 1:
            return frames[0]
        return pd.concat(_latest_parts_only(frames), ignore_index=True)

    @cached_property
    def iterations(self) -> pd.DataFrame:
        """One row per recorded iteration."""
        return self.read("iterations")

    @cached_property
    def layers(self) -> pd.DataFrame:
        """One row per iteration and module."""
        return self.read("layers")

    @cached_property
    def events(self) -> pd.DataFrame:
        """The memory timeline: one row per hook event."""
        return self.read("events")

    @property
    def run_id(self) -> str:
        """The run's identifier."""
        return str(self.meta["run_id"])


def _latest_parts_only(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Where an iteration appears in several parts, keeps only its rows of the last one.

    That happens when a background worker died after writing some parts of a batch: the profiler
    then writes those iterations again, whole.
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
    schema = SCHEMAS[table]
    names = list(columns) if columns else schema.names
    return schema.empty_table().select([n for n in names if n in schema.names]).to_pandas()


def load_trace(run_dir: str | Path) -> Trace:
    """Opens a run directory written by :class:`memprof.MemoryProfiler`.

    Metadata and every Parquet footer are validated now; table data is read on first access.

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
    for table in TABLES:
        found = table_parts(run_dir, table)
        for part in found:
            _check_part(part, table)
        parts[table] = tuple(found)
    return Trace(path=run_dir, meta=meta, _parts=parts, _recovered=recovered)


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
