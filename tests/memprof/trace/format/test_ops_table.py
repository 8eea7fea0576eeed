"""The optional ops table: written by a planning pass, read back as OpRecords; traces without it still read."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memprof.analysis.op_records import OpRecord
from memprof.errors import CorruptTraceError
from memprof.schema import OPS_SCHEMA, SCHEMA_VERSION
from memprof.trace.format.ops_table import ops_table, write_ops
from memprof.trace.reader import load_run

EXAMPLE_RUN = Path(__file__).parents[4] / "traces" / "example"

RECORDS = [
    OpRecord(index=0, module="0", op="aten.t.default", output_bytes=0),
    OpRecord(index=1, module="0", op="aten.addmm.default", output_bytes=320, forward_ms=0.25, flops=1280),
    OpRecord(index=2, module="1", op="aten.relu.default", output_bytes=320, needs=(2,), forward_ms=0.5, reads=(1,)),
    OpRecord(index=3, module="", op="aten.mm.default", output_bytes=80, needs=(2,), forward_ms=0.125, flops=640,
             reads=(2,), writes=()),
]


def _run(tmp_path: Path) -> Path:
    meta = {"format": "memprof-trace", "schema_version": SCHEMA_VERSION, "run_id": "ops", "created_at": "",
            "device": "cpu", "torch_version": "", "model": "M", "rank": 0, "world_size": 1}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path


def test_records_round_trip_per_iteration(tmp_path: Path) -> None:
    run = _run(tmp_path)
    write_ops(run, 1, RECORDS)
    write_ops(run, 5, RECORDS[:2])
    trace = load_run(run)
    assert trace.op_iterations == [1, 5]
    assert trace.op_records() == RECORDS  # the first iteration by default
    assert trace.op_records(1) == RECORDS
    assert trace.op_records(5) == RECORDS[:2]
    assert trace.op_records(2) == []
    frame = trace.read("ops")
    assert list(frame.columns) == OPS_SCHEMA.names
    assert frame.needs.map(list).tolist()[:4] == [[], [], [2], [2]]
    assert sorted((run / "ops.parquet").iterdir())[0].name == "part-000001.parquet"


def test_a_trace_without_the_table_has_no_records(tmp_path: Path) -> None:
    trace = load_run(_run(tmp_path))
    assert trace.op_records() == [] and trace.op_iterations == []
    assert trace.read("ops").columns.tolist() == OPS_SCHEMA.names
    assert write_ops(tmp_path, 0, []) is None and not (tmp_path / "ops.parquet").exists()


def test_the_committed_example_run_still_reads(tmp_path: Path) -> None:
    run = tmp_path / "example"
    shutil.copytree(EXAMPLE_RUN, run)
    trace = load_run(run)
    assert len(trace.iterations) > 0 and trace.op_records() == []


def test_a_bad_row_or_column_is_reported(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "ops.parquet").mkdir()
    table = ops_table(0, RECORDS).set_column(0, "iteration", pa.array([0] * 4, type=pa.int64()))
    needs = pa.array([[], [], [3], [2]], type=pa.list_(pa.int64()))  # relu needing a later op
    pq.write_table(table.set_column(5, "needs", needs), run / "ops.parquet" / "part-000001.parquet")
    with pytest.raises(CorruptTraceError, match="needs must name this op or earlier ones"):
        load_run(run).op_records()
    wrong = table.set_column(4, "output_bytes", pa.array([0.0] * 4))
    pq.write_table(wrong, run / "ops.parquet" / "part-000001.parquet")
    with pytest.raises(CorruptTraceError, match="output_bytes"):
        load_run(run)


def test_parts_written_before_the_writes_column_read_as_unknown(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "ops.parquet").mkdir()
    old = ops_table(0, RECORDS).drop_columns(["writes"])
    pq.write_table(old, run / "ops.parquet" / "part-000001.parquet")
    records = load_run(run).op_records()
    assert [r.writes for r in records] == [None] * len(RECORDS)
    assert [replace(r, writes=None) for r in RECORDS] == records


def test_parts_written_before_the_reads_column_read_as_unknown(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "ops.parquet").mkdir()
    old = ops_table(0, RECORDS).drop_columns(["reads"])
    pq.write_table(old, run / "ops.parquet" / "part-000001.parquet")
    records = load_run(run).op_records()
    assert [r.reads for r in records] == [None] * len(RECORDS)
    assert [replace(r, reads=None) for r in RECORDS] == records


def test_reads_of_later_ops_are_refused() -> None:
    with pytest.raises(ValueError, match="reads must name earlier ops"):
        OpRecord(index=2, module="", op="aten.relu.default", output_bytes=4, reads=(2,))
