"""Reading run directories: the one way every other part of the project reads a trace."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from memprof.analysis.iteration import ProcessedIteration
from memprof.analysis.op_records import OpRecord
from memprof.errors import CorruptTraceError
from memprof.schema import (
    ALLOCATIONS,
    ITERATIONS,
    OPS,
    OPTIONAL_TABLES,
    READ_SCHEMAS,
    STACKS,
    TABLES,
    costing_iterations,
    not_headlining,
)
from memprof.trace.damage import PartDamage, damage_message, footer_damage, relative_name
from memprof.trace.format.ops_table import records_from_frame
from memprof.trace.listing import RunEntry, list_runs, read_meta
from memprof.trace.liveness import run_state
from memprof.trace.parts import (
    RELIST_ATTEMPTS,
    BadPart,
    IterationRange,
    PartCache,
    PartVanished,
    list_parts,
    read_part,
    table_parts,
)
from memprof.trace.pipeline.recovery import recover, recovered_frame

__all__ = ["IterationRange", "PartDamage", "RunEntry", "Trace", "list_runs", "load_run", "read_meta", "table_parts"]


@dataclass(frozen=True)
class Trace:
    """One profiled run: its metadata and three tables, read lazily and cached.

    The ``iterations`` table has a row for every recorded iteration; ``layers`` and ``events`` (the
    detail) hold rows only for the iterations in :attr:`detail_iterations`. Read the detail of a few
    iterations with ``read(table, iterations=[...])``: only the parts that hold them are opened.

    A damaged part (truncated, overwritten, a damaged page) is skipped, not fatal: the run loses the
    iterations it held, :attr:`damage` lists it and :attr:`damage_message` says so in one line.

    Attributes:
        path: the run directory.
        meta: the contents of ``meta.json``.
    """

    path: Path
    meta: dict[str, Any]
    _parts: dict[str, tuple[Path, ...]] = field(repr=False)
    _recovered: list[ProcessedIteration] = field(default_factory=list, repr=False)
    _ranges: dict[str, tuple[IterationRange, ...]] = field(default_factory=dict, repr=False)
    # per table listed again since load_run: the last iteration of the first listing, beyond which
    # rows written since are not returned (the trace stays the snapshot load_run took)
    _snapshot_last: dict[str, int | None] = field(default_factory=dict, repr=False)
    # the parts skipped so far (found when the footers were checked, or later when a page failed its checksum)
    _damage: list[PartDamage] = field(default_factory=list, repr=False)
    _strict: bool = field(default=False, repr=False)
    _cache: PartCache | None = field(default=None, repr=False, compare=False)

    def read(self, table: str, columns: Sequence[str] | None = None,
             iterations: Iterable[int] | None = None) -> pd.DataFrame:
        """Reads one table (all parts), optionally only some columns and some iterations.

        Args:
            table: ``"iterations"``, ``"layers"``, ``"events"`` or ``"ops"`` (empty when no planning pass ran).
            columns: the columns to read (default: all).
            iterations: read only these iterations' rows (default: all); parts and row groups that
                cannot hold them are skipped.

        Raises:
            CorruptTraceError: a part lacks a requested column, or (``strict`` traces only) cannot be read.
        """
        if table not in READ_SCHEMAS:
            raise KeyError(f"unknown table {table!r}; expected one of {(*TABLES, *OPTIONAL_TABLES)}")
        wanted = None if iterations is None else sorted({int(i) for i in iterations})
        if columns is not None and "iteration" not in columns:
            # the iteration column tells which of two parts holding an iteration wins
            frame = self.read(table, ["iteration", *columns], wanted)
            return frame[list(columns)]
        frame = self._read_parts(table, columns, wanted)
        if table in (OPS, STACKS):
            # written whole, by the recording process itself, before its iteration's row: kept as it is
            return frame
        if table != ITERATIONS and "iteration" in frame.columns and self._has_iteration_rows:
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

    @property
    def _has_iteration_rows(self) -> bool:
        # a damaged iterations part counts: its iterations are lost, their detail rows with them
        return bool(self._parts[ITERATIONS]) or any(d.table == ITERATIONS for d in self._damage)

    @cached_property
    def _written_iterations(self) -> set[int]:
        if not self._parts[ITERATIONS]:
            return set()
        return set(self._read_parts(ITERATIONS, ["iteration"], None).iteration.tolist())

    @property
    def version(self) -> int:
        """The trace's schema version."""
        return int(self.meta["schema_version"])

    @property
    def damage(self) -> tuple[PartDamage, ...]:
        """The parts skipped as unreadable so far, with the iterations each cost (empty for a sound run)."""
        return tuple(self._damage)

    @property
    def damage_message(self) -> str | None:
        """:attr:`damage` in one line (the same words wherever the run is shown), or ``None``."""
        if not self._damage:
            return None
        lost = {i for d in self._damage if d.table == ITERATIONS for i in d.iterations}
        return damage_message(self._damage, len(self._written_iterations | lost) + self._recovered_count)

    @property
    def _recovered_count(self) -> int:
        return len({item.iteration for item in self._recovered} - self._written_iterations)

    @property
    def state(self) -> str:
        """``"running"``, ``"interrupted"`` (its writer died), ``"closed"`` or ``"failed"`` (see :mod:`~memprof.trace.liveness`)."""
        return run_state(self.meta)

    def _read_parts(self, table: str, columns: Sequence[str] | None, wanted: list[int] | None) -> pd.DataFrame:
        for _ in range(RELIST_ATTEMPTS):
            try:
                return self._read_listed(table, columns, wanted)
            except PartVanished:
                self._relist(table)
        raise CorruptTraceError(f"the parts of {table} in {self.path} kept vanishing while they were read "
                                f"({RELIST_ATTEMPTS} times); open the trace again")

    def _relist(self, table: str) -> None:
        """Lists a table's parts again after a live writer merged some of those listed away."""
        if table not in self._snapshot_last:
            ranges = self._ranges.get(table, ())
            known = all(r is not None for r in ranges) and bool(ranges)
            self._snapshot_last[table] = max(r[1] for r in ranges if r is not None) if known else None
        self._parts[table], self._ranges[table], _ = list_parts(self.path, table, self.version, self._cache)

    def _read_listed(self, table: str, columns: Sequence[str] | None, wanted: list[int] | None) -> pd.DataFrame:
        parts = self._parts[table]
        if wanted is not None:
            ranges = self._ranges.get(table) or (None,) * len(parts)
            parts = tuple(p for p, r in zip(parts, ranges) if _may_hold(r, wanted))
        names = list(columns) if columns else None
        filters: list[tuple[str, str, Any]] = [("iteration", "in", wanted)] if wanted is not None else []
        if self._snapshot_last.get(table) is not None:
            filters.append(("iteration", "<=", self._snapshot_last[table]))
        frames = []
        for part in parts:
            try:
                frames.append(read_part(part, table, self.version, names, filters or None, self._cache))
            except CorruptTraceError:
                if self._strict:
                    raise
                self._skip_damaged(table, part)
        if not frames:
            return _empty_frame(table, columns)
        if len(frames) == 1:
            return frames[0]
        return pd.concat(_latest_parts_only(frames), ignore_index=True)

    def _skip_damaged(self, table: str, part: Path) -> None:
        """Drops a part whose footer was sound but whose data is not (a damaged page), and says so once."""
        index = self._parts[table].index(part)
        found = self._ranges.get(table, ())[index] if self._ranges.get(table) else None
        self._parts[table] = self._parts[table][:index] + self._parts[table][index + 1:]
        if self._ranges.get(table):
            self._ranges[table] = self._ranges[table][:index] + self._ranges[table][index + 1:]
        lost: tuple[int, ...] = ()
        if found is not None and table != OPS:
            span = range(found[0], found[1] + 1)
            lost = tuple(span) if table == ITERATIONS else tuple(i for i in self.detail_iterations if i in span)
        if table == ITERATIONS:  # what was derived from the iterations read before is stale now
            for name in ("_written_iterations", "iterations", "detail_iterations"):
                self.__dict__.pop(name, None)
        self._damage.append(PartDamage(table, relative_name(part, self.path), "a damaged page (failed its checksum)",
                                       lost))
        _warn_damage(self)

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
    def costing_iterations(self) -> list[int]:
        """A compiled model's costing iterations (``[]`` for an eager model's run): those it ran compiled block by
        block (``meta.json``'s ``regional_iterations``), else those it ran eagerly (``eager_iterations``). They
        give the layers and the planner's chain; they ran as the user's compiled model does not, so they never
        headline the run (:attr:`headline_iterations`)."""
        return costing_iterations(self.meta)

    @cached_property
    def headline_iterations(self) -> pd.DataFrame:
        """The ``iterations`` rows a run's headline peak is chosen from: all but the costing iterations (all of
        them when every iteration was one)."""
        frame = self.iterations
        kept = frame[~frame.iteration.isin(not_headlining(self.meta))]
        return kept if len(kept) else frame

    @cached_property
    def layers(self) -> pd.DataFrame:
        """One row per detailed iteration and module."""
        return self.read("layers")

    @cached_property
    def events(self) -> pd.DataFrame:
        """The memory timeline of the detailed iterations: one row per hook event."""
        return self.read("events")

    @cached_property
    def allocations(self) -> pd.DataFrame:
        """The tensors of the detailed iterations (empty for traces written before the table existed)."""
        return self.read(ALLOCATIONS)

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
    (:mod:`memprof.trace.format.compaction`).
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


def load_run(run_dir: str | Path, *, strict: bool = False, cache: PartCache | None = None) -> Trace:
    """Opens one run directory written by :class:`memprof.MemoryProfiler` (one rank's, of a distributed run;
    :func:`memprof.load_trace` also opens a torchrun job's folder).

    Metadata and every Parquet footer are validated now; table data is read on first access. The
    trace is a snapshot of the run as it was then: should a live writer merge parts away before they
    are read (:mod:`memprof.trace.format.compaction`), the table's parts are listed again and only the
    iterations of the snapshot are returned.

    A part that cannot be read is skipped: the run loses only the iterations it held, and one
    ``RuntimeWarning`` names the table and those iterations (:attr:`Trace.damage_message`).

    Args:
        run_dir: the run directory.
        strict: raise :class:`CorruptTraceError` at the first damaged part instead of skipping it.
        cache: where footer checks and part reads are kept, keyed on each part's path, modification time
            and size, so that opening a live run again reads only its new parts (the dashboard passes one).

    Raises:
        TraceNotFoundError: the directory or its metadata is missing.
        CorruptTraceError: the metadata is damaged or written by another tool (or, ``strict``, any part is).
        SchemaVersionError: the trace's schema version is unknown to this reader.
    """
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    # the journal first, the parts second: what a live worker writes meanwhile is then in the parts
    recovered = recover(run_dir)
    parts: dict[str, tuple[Path, ...]] = {}
    ranges: dict[str, tuple[IterationRange, ...]] = {}
    bad: dict[str, tuple[BadPart, ...]] = {}
    version = int(meta["schema_version"])
    for table in (*TABLES, *OPTIONAL_TABLES):
        parts[table], ranges[table], bad[table] = list_parts(run_dir, table, version, cache)
        if strict and bad[table]:
            raise bad[table][0].error
    trace = Trace(path=run_dir, meta=meta, _parts=parts, _recovered=recovered, _ranges=ranges,
                  _strict=strict, _cache=cache)
    if any(bad.values()):
        trace._damage.extend(_footer_damage(trace, bad))
        _warn_damage(trace)
    return trace


def _footer_damage(trace: Trace, bad: dict[str, tuple[BadPart, ...]]) -> list[PartDamage]:
    """What each part with an unusable footer cost (see :func:`memprof.trace.damage.footer_damage`)."""
    return footer_damage(trace.path, bad, trace._parts, trace._ranges,
                         trace._written_iterations | {item.iteration for item in trace._recovered},
                         lambda: trace.detail_iterations, trace.meta.get("iterations"))


def _warn_damage(trace: Trace) -> None:
    warnings.warn(f"run {trace.run_id}: {trace.damage_message}", RuntimeWarning, stacklevel=3)
