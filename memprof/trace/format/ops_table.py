"""The optional ``ops`` table: the op records of a planning pass, written and read back.

A planning pass writes its records once, as one part of ``ops.parquet/`` (atomically, like every part),
beside the tables the profiler flushes; the reader returns them as
:class:`~memprof.analysis.op_records.OpRecord` (:meth:`memprof.trace.Trace.op_records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.analysis.op_records import OpRecord
from memprof.atomic import write_atomically
from memprof.errors import CorruptTraceError
from memprof.schema import OPS, OPS_SCHEMA, table_dir_name
from memprof.trace.format.compaction import parse_part_name, part_name

__all__ = ["ops_table", "records_from_frame", "write_ops"]


def ops_table(iteration: int, records: Sequence[OpRecord]) -> pa.Table:
    """The rows of ``records``, recorded in ``iteration``, with the ``ops`` table's schema."""
    columns = {
        "iteration": [int(iteration)] * len(records),
        "index": [r.index for r in records],
        "module": [r.module for r in records],
        "op": [r.op for r in records],
        "output_bytes": [r.output_bytes for r in records],
        "needs": [list(r.needs) for r in records],
        "forward_ms": [float(r.forward_ms) for r in records],
        "flops": [r.flops for r in records],
        "writes": [None if r.writes is None else list(r.writes) for r in records],
        "reads": [None if r.reads is None else list(r.reads) for r in records],
    }
    return pa.Table.from_pydict(columns, schema=OPS_SCHEMA)


def write_ops(run_dir: Path, iteration: int, records: Sequence[OpRecord]) -> Path | None:
    """Appends one part holding ``records`` to the run's ``ops`` table.

    Only the process that records the ops writes this table (a profiler's worker writes the others), so
    its parts are numbered here, after those already present.

    Returns:
        The part written, or ``None`` when there were no records.

    Raises:
        OSError: the part could not be written.
    """
    if not records:
        return None
    directory = Path(run_dir) / table_dir_name(OPS)
    directory.mkdir(parents=True, exist_ok=True)
    lasts = [parsed[1] for p in directory.glob("part-*.parquet") if (parsed := parse_part_name(p.name))]
    number = max(lasts, default=0) + 1
    sink = pa.BufferOutputStream()
    pq.write_table(ops_table(iteration, records), sink, compression="snappy", write_page_checksum=True,
                   write_statistics=["iteration"])
    path = directory / part_name(number, number, 0)
    write_atomically(path, memoryview(sink.getvalue()), durable=True)
    return path


def records_from_frame(frame: pd.DataFrame) -> list[OpRecord]:
    """The op records of one iteration's rows of the ``ops`` table, in index order.

    Raises:
        CorruptTraceError: a row is not a valid op record (negative bytes, a need after its op ...).
    """
    records = []
    for row in frame.sort_values("index").to_dict("records"):
        needs, writes = row["needs"], row.get("writes")
        try:
            records.append(OpRecord(index=int(row["index"]), module=str(row["module"]), op=str(row["op"]),
                                    output_bytes=int(row["output_bytes"]),
                                    needs=tuple(int(i) for i in (needs if needs is not None else ())),
                                    forward_ms=float(row["forward_ms"]), flops=int(row["flops"]),
                                    writes=_maybe_indexes(writes), reads=_maybe_indexes(row.get("reads"))))
        except ValueError as exc:
            raise CorruptTraceError(f"the ops table holds an invalid row: {exc}") from None
    return records


def _maybe_indexes(value: object) -> tuple[int, ...] | None:
    """A ``writes`` or ``reads`` cell: ``None`` when missing (older parts, NaN after concatenation), else its
    indexes."""
    if value is None or isinstance(value, float):
        return None
    return tuple(int(i) for i in value)  # type: ignore[attr-defined]
