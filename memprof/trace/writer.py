"""Crash-safe writing of a run directory.

Every file is written under a hidden temporary name in its final directory and then renamed over
its final name (``os.replace`` is atomic on POSIX), so a reader never sees half a file and a run
killed at any moment leaves every completed flush readable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from memprof.analysis.iteration import ProcessedIteration, flatten
from memprof.atomic import write_atomically
from memprof.trace.schema import EVENTS, ITERATIONS, LAYERS, META_FILE, SCHEMAS, table_dir_name


def write_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    """Writes ``meta.json`` atomically."""
    # fsynced: rewritten at open and close only, so the cost is paid twice per run, not per iteration
    write_atomically(run_dir / META_FILE, json.dumps(dict(meta), indent=2, sort_keys=True) + "\n", durable=True)


def rows_to_table(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Builds a pyarrow table with the contract's schema for ``table`` from row dicts.

    Missing required columns raise ``KeyError``; extra keys are kept as additional columns.
    """
    schema = SCHEMAS[table]
    columns: dict[str, list[Any]] = {name: [row[name] for row in rows] for name in schema.names}
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    fields = list(schema)
    extra = [k for k in (rows[0].keys() if rows else ()) if k not in schema.names]
    for key in extra:
        arr = pa.array([row.get(key) for row in rows])
        arrays.append(arr)
        fields.append(pa.field(key, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class TraceWriter:
    """Appends parts to the tables of one run directory.

    Args:
        run_dir: the run's directory; created if missing.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._next_part = {name: self._first_free_part(name) for name in SCHEMAS}

    def _first_free_part(self, table: str) -> int:
        directory = self.run_dir / table_dir_name(table)
        if not directory.is_dir():
            return 1
        numbers = [int(p.stem.split("-")[1]) for p in directory.glob("part-*.parquet") if p.stem[5:].isdigit()]
        return max(numbers, default=0) + 1

    def append(self, table: str, data: pa.Table | Sequence[Mapping[str, Any]]) -> Path | None:
        """Writes one part of ``table``; returns its path, or ``None`` when there was nothing to write."""
        if not isinstance(data, pa.Table):
            if not data:
                return None
            data = rows_to_table(table, data)
        if data.num_rows == 0:
            return None
        directory = self.run_dir / table_dir_name(table)
        directory.mkdir(exist_ok=True)
        path = directory / f"part-{self._next_part[table]:06d}.parquet"
        sink = pa.BufferOutputStream()
        # Parts are small (one iteration): dictionaries and per-column statistics cost more time than
        # they save space; the iteration column keeps its statistics so readers can skip parts.
        pq.write_table(data, sink, compression="snappy", write_page_checksum=True, use_dictionary=False,
                       write_statistics=["iteration"])
        # One write of the encoded part: pyarrow writing to the file itself costs ~0.1 ms more per part.
        write_atomically(path, memoryview(sink.getvalue()))
        self._next_part[table] += 1
        return path


def write_iterations(writer: TraceWriter, batch: Sequence[ProcessedIteration]) -> None:
    """Writes the parts of a batch of iterations; the iterations rows last.

    A reader keeps only iterations that have their row, so a kill between parts never leaves an
    iteration half-written. An item's ``before`` (the iteration before a failure, analysed again with its
    detail) is written in front of it, its row too: the reader's last-part rule then shows it detailed.

    Raises:
        OSError: a part could not be written (the parts written before it stay valid).
    """
    if not batch:
        return
    items = flatten(batch)
    writer.append(LAYERS, [row for item in items for row in item.layers])
    writer.append(EVENTS, pa.concat_tables([item.events for item in items]))
    writer.append(ITERATIONS, [item.row for item in items])
