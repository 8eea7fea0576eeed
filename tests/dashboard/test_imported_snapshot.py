"""The dashboard opens runs imported from PyTorch memory snapshots: their runs row, overview, layers, timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard import callbacks as cb
from dashboard.data import TraceStore
from memprof.interop import import_snapshot, write_snapshot
from memprof.units import format_bytes
from tests.memprof.interop.snapshots import Builder, forward_frames, training_snapshot, weight_frames


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    write_snapshot(tmp_path / "steps.pickle", training_snapshot().builder.snapshot())
    import_snapshot(tmp_path / "steps.pickle", tmp_path / "traces" / "steps")
    b = Builder()
    b.segment_alloc(1 << 21)
    b.alloc(4096, weight_frames())
    b.alloc(8192, forward_frames(("/work/torch_nn/linear.py", 125, 31)))
    b.oom(1 << 30, 1 << 20)
    write_snapshot(tmp_path / "oom.pickle", b.snapshot())
    import_snapshot(tmp_path / "oom.pickle", tmp_path / "traces" / "oom")
    return TraceStore(tmp_path / "traces")


def test_runs_and_overview(store):
    rows = {r["name"]: r for r in cb.runs_view(store)[0]}
    assert set(rows) == {"steps", "oom"} and not rows["steps"]["error"]
    assert rows["steps"]["peak"] == format_bytes(111104) and rows["steps"]["iterations"] == 2
    assert rows["steps"]["device"] == "cuda:0" and rows["steps"]["kind"] == "imported PyTorch snapshot steps.pickle"
    text, peaks, breakdown = cb.overview_view(store, ["steps"])
    assert format_bytes(111104) in text
    assert len(peaks.data) and len(breakdown.data)
    text, _, _ = cb.overview_view(store, ["oom"])
    assert "FAILED in iteration 0" in text and format_bytes(1 << 30) in text


def test_layers_and_timeline(store):
    rows, tree = cb.layers_view(store, ["steps"], 1, "feature_map_bytes")
    modules = {r["module"] for r in rows}
    assert "model@train:30.linear@model:31" in modules and "(model)" in modules
    assert len(tree.data)
    figure, note = cb.timeline_view(store, ["steps"], 1)
    events = store.timeline("steps", 1)
    assert int(events.allocated_bytes.max()) == 111104
    assert note == f"{len(events):,} of {len(events):,} events drawn."
    assert len(figure.data)
