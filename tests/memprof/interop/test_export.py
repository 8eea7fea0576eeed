"""``export_snapshot``: PyTorch's own memory_viz code reads the file, and importing it gives the trace back."""

from __future__ import annotations

import base64
import pickle
import pickletools
import re
from pathlib import Path

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

from examples import zoo
from memprof import MemoryProfiler, OutputExistsError, TraceError, load_trace
from memprof.categories import CATEGORY_COLUMNS
from memprof.interop import export_snapshot, import_snapshot, load_snapshot, snapshot_of, write_snapshot
from tests.memprof.interop.snapshots import training_snapshot

SUMMARY = ["iteration", "peak_allocated_bytes", "peak_phase", "peak_module", *CATEGORY_COLUMNS]
#: The opcodes MemoryViz.js's own unpickler implements (torch/utils/viz/MemoryViz.js, function unpickle).
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "EMPTY_DICT",
    "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1",
    "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BININT", "BININT1", "BININT2", "LONG1", "NONE",
    "NEWTRUE", "NEWFALSE", "BINFLOAT",
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """A real profiled run (CPU): Adam, 5 iterations, detail kept for iterations 0 and 1 only."""
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=64, in_features=32)
    optimizer = torch.optim.Adam(model.parameters())
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("traces"), print_period=0,
                        detail_first=2, detail_every=0, detail_peak_rise=100.0) as profiler:
        for _ in range(5):
            zoo.train_step(model, optimizer, make_batch(16))
            profiler.record_stats()
    assert load_trace(profiler.run_dir).detail_iterations == [0, 1]
    return profiler.run_dir


def _round_trip(run_dir: Path, tmp_path: Path) -> tuple[object, object]:
    export_snapshot(run_dir, tmp_path / "exported.pickle")
    back = import_snapshot(tmp_path / "exported.pickle", tmp_path / "back")
    return load_trace(run_dir), load_trace(back)


def test_a_profiled_run_round_trips_peaks_and_categories(profiled, tmp_path):
    original, back = _round_trip(profiled, tmp_path)
    assert back.iterations[SUMMARY].equals(original.iterations[SUMMARY])
    # the detailed iterations keep their timeline: every event row's bytes are a state of the snapshot
    exported = load_snapshot(tmp_path / "exported.pickle")
    levels = _levels(exported["device_traces"][0])
    for row in original.events.to_dict("records"):
        assert row["allocated_bytes"] in levels


def test_an_imported_snapshot_round_trips(tmp_path):
    write_snapshot(tmp_path / "torch.pickle", training_snapshot().builder.snapshot())
    first = import_snapshot(tmp_path / "torch.pickle", tmp_path / "first")
    original, back = _round_trip(first, tmp_path)
    assert back.iterations[SUMMARY].equals(original.iterations[SUMMARY])
    assert back.iterations.peak_allocated_bytes.tolist() == [88576, 111104]


def _levels(entries: list[dict]) -> set[int]:
    level, seen = 0, {0}
    for entry in entries:
        if entry["action"] in ("alloc", "free_completed"):
            level += entry["size"] if entry["action"] == "alloc" else -entry["size"]
            seen.add(level)
    return seen


def test_memory_viz_reads_it(profiled, tmp_path):
    out = export_snapshot(profiled, tmp_path / "run.pickle")
    snapshot = load_snapshot(out)
    trace = load_trace(profiled)
    entries = snapshot["device_traces"][0]
    # the highest level the allocations reach is the run's peak
    assert max(_levels(entries)) == int(trace.iterations.peak_allocated_bytes.max())
    # torch's own readers: segsum checks that every segment's blocks add up, trace walks every entry
    summary = memory_viz.segsum(snapshot)
    final = int(trace.iterations.sort_values("iteration").allocated_bytes.iloc[-1])
    assert f"total_allocated: {memory_viz.Bytes(final)}" in summary
    assert memory_viz.trace(snapshot).startswith(f"Device 0 ----------------\n{len(entries)} entries")
    lines = memory_viz.segments(snapshot, format_flamegraph=lambda text: text).splitlines()
    assert len(lines) == len(snapshot["segments"])
    # (memory_viz keeps a frame's file name after its last '/': memprof/category -> category)
    pattern = r"stream_0;seg_\d+;active_allocated;iteration:\d+:\w+;phase:0:\w+;module:0:[\w.]*;category:0:\w+ \d+"
    assert all(re.fullmatch(pattern, line) for line in lines), lines[:3]
    # the HTML viewers embed the pickle; MemoryViz.js unpickles it with its own decoder: only these opcodes
    page = memory_viz.trace_plot(snapshot)
    embedded = base64.b64decode(re.search(r'"base64": "([^"]+)"', page).group(1))
    assert pickle.loads(embedded.rstrip(b"\x00")) == snapshot
    assert {op.name for op, _, _ in pickletools.genops(out.read_bytes())} <= MEMORY_VIZ_OPCODES
    assert "Allocator State History" in memory_viz.segment_plot(snapshot)


def test_entries_carry_categories_and_frames(profiled, tmp_path):
    snapshot = snapshot_of(profiled)
    entries = snapshot["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert {e["category"] for e in allocs} <= set(CATEGORY_COLUMNS)
    assert {"weights", "optimizer_state", "feature_maps"} <= {e["category"] for e in allocs}
    # memory_viz adds 'unknown' to a snapshot's categories only through a typo: segments carry it
    assert {e["category"] for e in entries if e["action"].startswith("segment")} == {"unknown"}
    names = {f["name"] for e in allocs for f in e["frames"] if f["filename"] == "memprof/module"}
    assert len(names) > 2 and names <= set(load_trace(profiled).events.module)
    times = [e["time_us"] for e in entries]
    assert times == sorted(times)
    # every live block at the end sits in its own segment, as torch writes segments
    for segment in snapshot["segments"]:
        (block,) = segment["blocks"]
        assert block["address"] == segment["address"] and block["size"] == segment["total_size"]
        assert block["state"] == "active_allocated" and segment["device"] == 0


def test_the_device_is_kept(tmp_path):
    from tests.memprof.interop.test_import import _two_devices

    write_snapshot(tmp_path / "two.pickle", _two_devices())
    run = import_snapshot(tmp_path / "two.pickle", tmp_path / "two") / "rank=1"
    snapshot = snapshot_of(run)
    assert [len(t) > 0 for t in snapshot["device_traces"]] == [False, True]
    assert {s["device"] for s in snapshot["segments"]} == {1}


def test_existing_output_is_kept_and_bad_runs_refused(profiled, tmp_path):
    out = tmp_path / "run.pickle"
    out.write_bytes(b"precious")
    with pytest.raises(OutputExistsError, match="pass --force"):
        export_snapshot(profiled, out)
    assert out.read_bytes() == b"precious"
    export_snapshot(profiled, out, force=True)
    assert load_snapshot(out)["device_traces"][0]
    with pytest.raises(TraceError):
        export_snapshot(tmp_path / "no-such-run", tmp_path / "x.pickle")
    assert not (tmp_path / "x.pickle").exists()
