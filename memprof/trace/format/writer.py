"""Crash-safe writing of a run directory.

Every file is written under a hidden temporary name in its final directory and then renamed over
its final name (``os.replace`` is atomic on POSIX), so a reader never sees half a file and a run
killed at any moment leaves every completed flush readable. Each flush appends one part per table;
:mod:`memprof.trace.format.compaction` merges small parts into bigger ones so that a table keeps a bounded
number of files however long the run.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from memprof.analysis.iteration import ProcessedIteration, flatten
from memprof.atomic import write_atomically
from memprof.schema import (
    ALLOCATIONS,
    EVENTS,
    ITERATIONS,
    LATER_COLUMNS,
    LAYERS,
    META_FILE,
    READ_SCHEMAS,
    SCHEMAS,
    STACKS,
    table_dir_name,
)
from memprof.trace.format.compaction import (
    CompactionPolicy,
    Part,
    merge_parts,
    open_parts,
    parse_part_name,
    part_name,
)

#: The tables the training process writes itself and compacts with its own writer (the worker never opens them).
STACKS_TABLES: tuple[str, ...] = (STACKS,)


def write_meta(run_dir: Path, meta: Mapping[str, Any], durable: bool = True) -> None:
    """Writes ``meta.json`` atomically; fsynced and indented unless ``durable`` is false (a live run's periodic
    update, which the next one or the close replaces: its cost stays off the training step, and json's indented
    form is its pure-Python encoder, 5 ms for a run's phase times)."""
    text = json.dumps(dict(meta), indent=2 if durable else None, sort_keys=True)
    write_atomically(run_dir / META_FILE, text + "\n", durable=durable)


def rows_to_table(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Builds a pyarrow table with the contract's schema for ``table`` from row dicts.

    Missing required columns raise ``KeyError``; a column added to the format later (``LATER_COLUMNS``) may be
    left out and takes the value the reader gives parts that lack it; extra keys are kept as additional columns.
    """
    schema = READ_SCHEMAS[table]
    later = LATER_COLUMNS.get(table, {})
    columns: dict[str, list[Any]] = {
        name: [row[name] for row in rows] if name not in later else [row.get(name, later[name]) for row in rows]
        for name in schema.names}
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    fields = list(schema)
    extra = [k for k in (rows[0].keys() if rows else ()) if k not in schema.names]
    for key in extra:
        arr = pa.array([row.get(key) for row in rows])
        arrays.append(arr)
        fields.append(pa.field(key, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class TraceWriter:
    """Appends parts to the tables of one run directory and merges them as :attr:`policy` says.

    Opening a writer on an existing run directory (the inline takeover does, after killing the
    worker) first removes what a killed writer left behind in its tables: the inputs of an unfinished
    merge and temporary files. Only one writer may write a table at a time: the worker (or the inline
    takeover) writes the flushed tables, the training process its ``stacks`` (:data:`STACKS_TABLES`).

    Args:
        run_dir: the run's directory; created if missing.
        policy: when parts are merged (:class:`~memprof.trace.format.compaction.CompactionPolicy`).
        tables: the tables this writer appends to and compacts (default: the flushed ones, ``SCHEMAS``).

    Raises:
        KeyError: a table the format does not know.
    """

    def __init__(self, run_dir: Path, policy: CompactionPolicy | None = None,
                 tables: Sequence[str] = tuple(SCHEMAS)) -> None:
        unknown = [t for t in tables if t not in READ_SCHEMAS]
        if unknown:
            raise KeyError(f"no table named {unknown[0]!r}; expected some of {sorted(READ_SCHEMAS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.policy = policy or CompactionPolicy()
        self.tables = tuple(tables)
        # a table another process writes is never listed here: opening it would delete that writer's temporaries
        self._parts: dict[str, list[Part]] = {name: open_parts(self._directory(name)) for name in self.tables}
        self._next_part = {name: self._first_free_part(name) for name in self.tables}
        # the tables of the appended parts that the next merge may take, so that it need not read them
        self._loaded: dict[Path, pa.Table] = {}
        self._merge_failed = False

    def _directory(self, table: str) -> Path:
        return self.run_dir / table_dir_name(table)

    def _first_free_part(self, table: str) -> int:
        directory = self._directory(table)
        if not directory.is_dir():
            return 1
        lasts = [parsed[1] for p in directory.glob("part-*.parquet") if (parsed := parse_part_name(p.name))]
        return max(lasts, default=0) + 1

    def parts(self, table: str) -> list[Path]:
        """The parts of ``table`` this writer knows, in name order."""
        return [part.path for part in self._parts[table]]

    def append(self, table: str, data: pa.Table | Sequence[Mapping[str, Any]]) -> Path | None:
        """Writes one part of ``table``; returns its path, or ``None`` when there was nothing to write.

        Raises:
            KeyError: ``table`` is not one of this writer's :attr:`tables`.
        """
        if table not in self._parts:
            raise KeyError(f"this writer writes {self.tables}, not {table!r}: open one with tables=({table!r},)")
        if not isinstance(data, pa.Table):
            if not data:
                return None
            data = rows_to_table(table, data)
        if data.num_rows == 0:
            return None
        directory = self._directory(table)
        directory.mkdir(exist_ok=True)
        number = self._next_part[table]
        path = directory / part_name(number, number, 0)
        sink = pa.BufferOutputStream()
        # Parts are small (one flush): dictionaries and per-column statistics cost more time than
        # they save space; the iteration column keeps its statistics so readers can skip parts.
        pq.write_table(data, sink, compression="snappy", write_page_checksum=True, use_dictionary=False,
                       write_statistics=["iteration"])
        encoded = sink.getvalue()
        # One write of the encoded part: pyarrow writing to the file itself costs ~0.1 ms more per part.
        write_atomically(path, memoryview(encoded))
        self._next_part[table] += 1
        parts = self._parts[table]
        parts.append(Part(path, number, number, 0, data.num_rows, encoded.size))
        self._loaded[path] = data
        if len(parts) > self.policy.fan_in:  # out of reach of the next merge
            self._loaded.pop(parts[-self.policy.fan_in - 1].path, None)
        return path

    def compact(self) -> list[Path]:
        """Merges the trailing parts of every table as long as the policy asks for it.

        A merge that fails (a full disk, a damaged part) leaves the parts as they were, readable; it
        is reported once per writer as a ``RuntimeWarning`` and tried again at the next call.

        Returns:
            The merged parts written, in order.
        """
        written: list[Path] = []
        for table in self.tables:
            parts = self._parts[table]
            while (inputs := self.policy.plan(parts)) is not None:
                try:
                    merged = merge_parts(inputs, self.policy.row_group_rows, self._loaded)
                except (OSError, pa.ArrowException) as exc:
                    self._report_merge_failure(table, exc)
                    break
                for part in inputs:
                    self._loaded.pop(part.path, None)
                del parts[-len(inputs):]
                parts.append(merged)
                written.append(merged.path)
        return written

    def _report_merge_failure(self, table: str, exc: BaseException) -> None:
        if not self._merge_failed:
            self._merge_failed = True
            warnings.warn(f"memprof could not merge the parts of {self._directory(table)} ({exc}); they stay as "
                          "they are (readable, only more files) and the merge is tried again at the next flush",
                          RuntimeWarning, stacklevel=3)


def write_iterations(writer: TraceWriter, batch: Sequence[ProcessedIteration]) -> None:
    """Writes the parts of a batch of iterations, the iterations rows last, then compacts the tables.

    A reader keeps only iterations that have their row, so a kill between parts never leaves an
    iteration half-written. An item's ``before`` (the iteration before a failure, analysed again with its
    detail) is written in front of it, its row too: the reader's last-part rule then shows it detailed.
    Compaction comes after the whole batch, so it never delays an iteration's becoming readable.

    Raises:
        OSError: a part could not be written (the parts written before it stay valid).
    """
    if not batch:
        return
    items = flatten(batch)
    writer.append(LAYERS, [row for item in items for row in item.layers])
    writer.append(EVENTS, pa.concat_tables([item.events for item in items]))
    allocations = [item.allocations for item in items if item.allocations is not None]
    if allocations:  # the drill-down's rows (optional table: traces before it have none)
        writer.append(ALLOCATIONS, pa.concat_tables(allocations))
    writer.append(ITERATIONS, [item.row for item in items])
    writer.compact()
