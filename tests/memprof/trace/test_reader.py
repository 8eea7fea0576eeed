"""Traces round-trip, and every kind of bad trace gets its own clear error."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

from memprof import CorruptTraceError, SchemaVersionError, TraceNotFoundError, list_runs, load_trace
from memprof.schema import SCHEMAS
from tests.memprof.helpers import profile_steps


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    trace = profile_steps(model, lambda n: (torch.randn(n, 6), torch.randint(0, 2, (n,))),
                          tmp_path_factory.mktemp("traces"), steps=3, background=False)
    return trace.path  # inline: one part per iteration, so the tests can damage one of several


def test_round_trip_has_every_contract_column(run_dir):
    trace = load_trace(run_dir)
    for key in ("schema_version", "run_id", "created_at", "device", "torch_version", "model", "rank", "world_size"):
        assert key in trace.meta
    assert trace.meta["model"] == "Sequential" and trace.meta["device"] == "cpu"
    for table, schema in SCHEMAS.items():
        frame = getattr(trace, table)
        assert list(frame.columns)[: len(schema.names)] == schema.names
    assert trace.iterations.iteration.tolist() == [0, 1, 2]
    assert set(trace.layers.module) == {"", "0", "1", "2"}
    # one part per flush, and pandas reads a table directory as one frame
    assert len(list((run_dir / "events.parquet").glob("part-*.parquet"))) == 3
    assert len(pd.read_parquet(run_dir / "events.parquet")) == len(trace.events)


def test_read_only_some_columns(run_dir):
    frame = load_trace(run_dir).read("events", columns=["iteration", "allocated_bytes"])
    assert list(frame.columns) == ["iteration", "allocated_bytes"]


def _copy(run_dir, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


def test_truncated_parquet_is_reported(run_dir, tmp_path):
    copy = _copy(run_dir, tmp_path)
    part = sorted((copy / "layers.parquet").glob("part-*.parquet"))[1]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    with pytest.warns(RuntimeWarning, match="layer detail of iteration 1 .*not a readable Parquet file"):
        trace = load_trace(copy)
    assert sorted(set(trace.layers.iteration)) == [0, 2] and len(trace.iterations) == 3  # only its iteration lost
    with pytest.raises(CorruptTraceError, match="not a readable Parquet file.*truncated"):
        load_trace(copy, strict=True)


def test_foreign_parquet_is_reported(run_dir, tmp_path):
    copy = _copy(run_dir, tmp_path)
    part = sorted((copy / "iterations.parquet").glob("part-*.parquet"))[0]
    pd.DataFrame({"x": [1, 2]}).to_parquet(part)
    with pytest.raises(CorruptTraceError, match="missing columns"):
        load_trace(copy)


def test_unknown_schema_version_is_reported(run_dir, tmp_path):
    copy = _copy(run_dir, tmp_path)
    meta = json.loads((copy / "meta.json").read_text())
    meta["schema_version"] = 999
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaVersionError, match="999.*reads versions 1, 2.*upgrade"):
        load_trace(copy)


def test_foreign_json_and_corrupt_json(run_dir, tmp_path):
    copy = _copy(run_dir, tmp_path)
    (copy / "meta.json").write_text(json.dumps({"hello": "world"}))
    with pytest.raises(CorruptTraceError, match="expected format 'memprof-trace'"):
        load_trace(copy)
    (copy / "meta.json").write_text("{not json")
    with pytest.raises(CorruptTraceError, match="not valid JSON"):
        load_trace(copy)


def test_empty_and_missing_directories(tmp_path):
    with pytest.raises(TraceNotFoundError, match="no meta.json"):
        load_trace(tmp_path)
    with pytest.raises(TraceNotFoundError, match="no trace directory"):
        load_trace(tmp_path / "absent")


def test_list_runs_lists_bad_runs_with_their_error(run_dir, tmp_path):
    good = _copy(run_dir, tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("[]")
    runs = {r.name: r for r in list_runs(tmp_path)}
    assert runs[good.name].error is None and runs[good.name].meta["model"] == "Sequential"
    assert runs["bad"].meta is None and "not memprof metadata" in runs["bad"].error


def test_hidden_temporary_files_are_ignored(run_dir, tmp_path):
    copy = _copy(run_dir, tmp_path)
    (copy / "events.parquet" / ".part-000009.parquet.abc.tmp").write_bytes(b"half a file")
    assert len(load_trace(copy).events) == len(load_trace(run_dir).events)


def test_an_iteration_written_twice_is_read_from_its_last_part():
    from memprof.trace.reader import _latest_parts_only

    first = pd.DataFrame({"iteration": [0, 0, 1, 1], "module": ["", "a", "", "a"], "x": [1, 2, 3, 4]})
    again = pd.DataFrame({"iteration": [1, 1, 2], "module": ["", "a", ""], "x": [30, 40, 50]})
    kept = pd.concat(_latest_parts_only([first, again]), ignore_index=True)
    assert kept.x.tolist() == [1, 2, 30, 40, 50]  # iteration 1 once, from the later part
    untouched = _latest_parts_only([first, again.assign(iteration=[2, 2, 3])])
    assert [len(f) for f in untouched] == [4, 3]  # no repeats: nothing dropped
