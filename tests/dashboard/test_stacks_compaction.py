"""The ``stacks`` table is compacted like the flushed tables: a bounded number of parts, the same rows, and the
drill-down still finds each allocation's call and stack."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import torch
from torch import nn

import memprof.capture.stacks as stacks
from dashboard.data import TraceStore
from dashboard.drilldown import tensors_view
from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.schema import STACKS, STACKS_SCHEMA, table_dir_name
from memprof.trace.drilldown import allocations_with_ops
from memprof.trace.format.compaction import FAN_IN
from memprof.trace.format.writer import STACKS_TABLES, TraceWriter
from memprof.trace.parts import table_parts

STEPS = 20  # every one detailed and captured: 20 appended parts, 2 merges of 8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[pa.Table]]:
    """A real run whose every iteration is captured, and the stacks tables the profiler appended, in order."""
    appended: list[pa.Table] = []
    original = stacks.write_stacks

    def recording(writer, iteration, rows):
        appended.append(pa.Table.from_pandas(_rows(iteration, rows), schema=STACKS_SCHEMA, preserve_index=False))
        return original(writer, iteration, rows)

    stacks.write_stacks = recording
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("traces"), run_id="real",
                            print_period=0, background=False, detail_first=2, detail_every=1,
                            stack_min_bytes=4096) as profiler:
            for _ in range(STEPS):
                zoo.train_step(model, optimizer, (torch.randn(32, 64), torch.randint(0, 4, (32,))))
                profiler.record_stats()
    finally:
        stacks.write_stacks = original
    return profiler.run_dir, appended


def _rows(iteration: int, rows: list[tuple[int, int, int, str, str]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["time_ns", "ptr", "bytes", "op", "stack"])
    return frame.assign(iteration=iteration)[["iteration", "time_ns", "ptr", "bytes", "op", "stack"]]


def _uncompacted(run_dir: Path, appended: list[pa.Table], into: Path) -> Path:
    """A copy of the run whose stacks are one part per captured iteration, as before compaction."""
    copy = Path(shutil.copytree(run_dir, into))
    shutil.rmtree(copy / table_dir_name(STACKS))
    writer = TraceWriter(copy, tables=STACKS_TABLES)
    for table in appended:
        writer.append(STACKS, table)  # never compacted
    return copy


def test_the_stacks_parts_are_merged(run):
    run_dir, appended = run
    assert len(appended) == STEPS
    found = table_parts(run_dir, STACKS)
    # the base-8 digits of 20 appends: 2 merged parts of 8, then 4 appended ones
    assert len(found) == STEPS // FAN_IN + STEPS % FAN_IN == 6
    assert [p.name for p in found[:2]] == ["part-000008.t1-000001.parquet", "part-000016.t1-000009.parquet"]


def test_the_stacks_read_back_identical(run, tmp_path):
    run_dir, appended = run
    expected = pd.concat([t.to_pandas() for t in appended], ignore_index=True)
    read = load_trace(run_dir).read(STACKS)
    pd.testing.assert_frame_equal(read.reset_index(drop=True), expected, check_dtype=False)
    before = load_trace(_uncompacted(run_dir, appended, tmp_path / "old"))
    assert len(table_parts(before.path, STACKS)) == STEPS
    pd.testing.assert_frame_equal(read, before.read(STACKS))
    for iteration in (3, 17):  # one in a merged part, one in an appended one
        one = load_trace(run_dir).read(STACKS, iterations=[iteration])
        pd.testing.assert_frame_equal(one.reset_index(drop=True),
                                      expected[expected.iteration == iteration].reset_index(drop=True),
                                      check_dtype=False)


def test_the_drilldown_still_finds_the_stacks(run, tmp_path):
    run_dir, appended = run
    before = load_trace(_uncompacted(run_dir, appended, tmp_path / "old"))
    after = load_trace(run_dir)
    for iteration in (3, 12, 17):
        joined = allocations_with_ops(after, iteration)
        pd.testing.assert_frame_equal(joined, allocations_with_ops(before, iteration))
        forward = joined[(joined["phase"] == "forward") & (joined["module"] != "")]  # the model's forward's
        assert len(forward) and (forward["op"] != "").all() and (forward["stack"] != "").any()
    store = TraceStore(run_dir.parent)
    frame = store.timeline("real", 3)
    forward_done = frame.index[frame["phase"] == "forward"][-1]  # the activations kept for backward are alive
    rows, tips, note = tensors_view(store, ["real"], 3, {"points": [{"x": float(frame["time_ms"][forward_done])}]})
    assert rows and note.startswith(f"{len(rows)} tensors alive at")
    relu = [row for row in rows if row["op"] == "torch.nn.functional.relu"]  # its part was merged: still found
    assert relu and relu[0]["size"] == "32.0 KiB" and relu[0]["called_from"].endswith("in train_step")
    assert any(tip for tip in tips)
