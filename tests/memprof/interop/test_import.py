"""``import_snapshot``: hand-built snapshots of known training steps, read back to the byte."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from memprof import OutputExistsError, SnapshotFormatError, load_trace
from memprof.categories import CATEGORY_COLUMNS
from memprof.interop import import_snapshot, load_snapshot, write_snapshot
from memprof.units import format_bytes
from tests.memprof.interop.snapshots import (
    KIB,
    Builder,
    forward_frames,
    train_frames,
    training_snapshot,
    weight_frames,
)

MIB = 1 << 20
SEGMENT = 2 * MIB
FC1, ACT, FC2 = "model@train:30.linear@model:31", "model@train:30.activation@model:32", "model@train:30.linear@model:33"


def _import(tmp_path: Path, snapshot: dict, name: str = "run", **kwargs) -> Path:
    path = tmp_path / f"{name}.pickle"
    write_snapshot(path, snapshot)
    return import_snapshot(path, tmp_path / "traces" / name, **kwargs)


def _categories(row) -> dict[str, int]:
    return {name: int(row[name]) for name in CATEGORY_COLUMNS if int(row[name])}


def _changes(trace, iteration: int) -> list[int]:
    events = trace.events[trace.events.iteration == iteration]
    return events[events.event.isin(["alloc", "free"])].allocated_bytes.tolist()


# The two steps of tests.memprof.interop.snapshots.training_snapshot, by hand (bytes requested):
WEIGHTS, ADAM, GRADS_W = 20 * KIB, 40 * KIB, 20 * KIB
# step 0: weights, batch, fc1, relu, workspace and its free, fc2, loss; backward; Adam's state and temporary
STEP0 = [16384, 20480, 24576, 32768, 40960, 41984, 40960, 43008, 43520,
         44032, 52224, 51712, 55808, 64000, 55808, 53760, 45568, 61952, 70144, 61952, 53760, 45568,
         61952, 78336, 82432, 86528, 88576, 86528, 82432, 81920, 65536, 61440]
# step 1 starts from weights + Adam's state; its peak is fc1's input gradient in backward
STEP1 = [65536, 73728, 81920, 82944, 81920, 83968, 84480,
         84992, 93184, 92672, 96768, 104960, 96768, 94720, 86528, 102912, 111104, 102912, 94720, 86528,
         88576, 86528, 82432, 81920]


def test_two_training_steps_exact(tmp_path):
    trace = load_trace(_import(tmp_path, training_snapshot().builder.snapshot()))
    rows = trace.iterations.set_index("iteration")
    assert list(rows.index) == [0, 1]
    assert _changes(trace, 0) == STEP0 and _changes(trace, 1) == STEP1
    first, second = rows.loc[0], rows.loc[1]
    assert int(first.peak_allocated_bytes) == 88576 and first.peak_phase == "optimizer"
    assert _categories(first) == {"weights": WEIGHTS, "weight_grads": GRADS_W, "optimizer_state": ADAM,
                                  "other": 4 * KIB + 512 + 2 * KIB}  # the batch, the loss, Adam's temporary
    assert int(second.peak_allocated_bytes) == 111104 and second.peak_phase == "backward"
    assert _categories(second) == {"weights": WEIGHTS, "optimizer_state": ADAM, "weight_grads": GRADS_W,
                                   "feature_maps": 8 * KIB, "grads": 16 * KIB, "other": 4 * KIB + 512}
    assert int(first.allocated_bytes) == WEIGHTS + ADAM and int(second.allocated_bytes) == WEIGHTS + ADAM + GRADS_W
    assert [int(first.num_allocations), int(second.num_allocations)] == [19, 13]
    # the allocator cache: one 2 MiB segment from the first entry on
    assert int(first.peak_reserved_bytes) == int(second.reserved_bytes) == SEGMENT
    events = trace.events
    assert events.reserved_bytes.tolist()[:2] == [0, SEGMENT] and set(events.reserved_bytes[1:]) == {SEGMENT}
    # the forward's rows name the module calls its frames show, in order
    forward = events[(events.iteration == 1) & (events.phase == "forward")]
    assert list(zip(forward.module, forward.event))[:5] == [
        ("", "enter"), ("model@train:30", "enter"), (FC1, "enter"), (FC1, "alloc"), (FC1, "exit")]
    meta = trace.meta
    assert meta["source"] == "pytorch-snapshot" and meta["source_file"] == "run.pickle"
    assert meta["device"] == "cuda:0" and meta["status"] == "closed" and meta["detail"]["iterations"] == [0, 1]
    assert meta["snapshot"]["end_allocated_bytes"] == WEIGHTS + ADAM + GRADS_W
    assert meta["snapshot"]["end_reserved_bytes"] == SEGMENT


def test_layers_name_the_modules_the_frames_show(tmp_path):
    trace = load_trace(_import(tmp_path, training_snapshot().builder.snapshot()))
    layers = trace.layers[trace.layers.iteration == 1].set_index("module")
    assert list(layers.index) == ["", "model@train:30", FC1, ACT, FC2]
    assert layers.loc[FC1, "parent"] == "model@train:30" and layers.loc[FC1, "kind"] == "linear.py:forward"
    assert layers.loc[FC1, "feature_map_bytes"] == 8 * KIB and layers.loc[ACT, "feature_map_bytes"] == 8 * KIB
    assert layers.loc[FC2, "feature_map_bytes"] == 2 * KIB  # its workspace was freed in the call: not kept
    # its 1 KiB workspace stays below the 2 KiB it keeps: no overhead above them (ROTOR's o_f)
    assert layers.loc[FC2, "forward_overhead_bytes"] == 0
    assert layers.loc["model@train:30", "saved_bytes"] == 18 * KIB
    assert (layers.calls == 1).all() and (layers.weight_bytes == 0).all()


def test_python_only_stacks_give_the_same_trace(tmp_path):
    """With ``stacks="python"`` backward allocations have no frames; they follow the forward, so are backward."""
    full = load_trace(_import(tmp_path, training_snapshot().builder.snapshot(), "cpp"))
    python = load_trace(_import(tmp_path, training_snapshot(engine_frames=False).builder.snapshot(), "python"))
    columns = ["iteration", "peak_allocated_bytes", "peak_phase", *CATEGORY_COLUMNS]
    assert python.iterations[columns].equals(full.iterations[columns])
    columns = ["phase", "module", "event", "allocated_bytes", *CATEGORY_COLUMNS]
    assert python.events[columns].equals(full.events[columns])


def test_a_ring_buffer_that_began_mid_step_keeps_the_absolute_level(tmp_path):
    run = training_snapshot()
    trace = run.builder.trace
    start = next(i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == 8 * KIB
                 and e["frames"] and "Engine" in e["frames"][-1]["name"])  # fc2's input gradient in step 0
    before = sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace[:start]
                 if e["action"] in ("alloc", "free_completed"))
    assert before == 44032  # weights, batch, fc1, relu, fc2's output, loss, the loss's gradient
    full = load_trace(_import(tmp_path, run.builder.snapshot(), "full"))
    cut = load_trace(_import(tmp_path, run.builder.snapshot(first_entry=start), "cut"))
    events = cut.events
    assert int(events.allocated_bytes.iloc[0]) == before and int(events.reserved_bytes.iloc[0]) == SEGMENT
    assert cut.meta["snapshot"]["initial_allocated_bytes"] == before
    assert cut.meta["snapshot"]["initial_reserved_bytes"] == SEGMENT
    assert _changes(cut, 0) == STEP0[STEP0.index(44032) + 1:] and _changes(cut, 1) == STEP1
    # blocks allocated before the trace get their categories from their frames: both steps' peaks are exact
    columns = ["iteration", "peak_allocated_bytes", "peak_phase", *CATEGORY_COLUMNS]
    assert cut.iterations[columns].equals(full.iterations[columns])
    # at the first entry: weights; the batch and the loss (other); what backward frees: three activations and
    # the loss's gradient, known only by the frames of their frees (feature maps)
    assert _categories(events.iloc[0]) == {"weights": WEIGHTS, "other": 4 * KIB + 512,
                                           "feature_maps": 18 * KIB + 512}


def test_the_allocator_cache_over_several_segments(tmp_path):
    b = Builder()
    b.segment_alloc(SEGMENT)
    small = b.alloc(MIB - 100, train_frames())
    big_segment = b.segment_alloc(20 * MIB)
    big = b.alloc(12 * MIB, train_frames())
    b.free(big)
    b.segment_free(big_segment)  # empty_cache()
    b.segment_alloc(4 * MIB)
    last = b.alloc(3 * MIB, train_frames())
    trace = load_trace(_import(tmp_path, b.snapshot()))
    events = trace.events
    rows = events[events.event != "forward"]
    assert rows.event.tolist() == ["start", "segment_alloc", "alloc", "segment_alloc", "alloc", "free",
                                   "segment_free", "segment_alloc", "alloc", "end"]
    assert rows.reserved_bytes.tolist() == [0, 2 * MIB, 2 * MIB, 22 * MIB, 22 * MIB, 22 * MIB, 2 * MIB, 6 * MIB,
                                            6 * MIB, 6 * MIB]
    assert rows.allocated_bytes.tolist() == [0, 0, MIB - 100, MIB - 100, 13 * MIB - 100, MIB - 100, MIB - 100,
                                             MIB - 100, 4 * MIB - 100, 4 * MIB - 100]
    row = trace.iterations.iloc[0]
    assert int(row.peak_reserved_bytes) == 22 * MIB and int(row.reserved_bytes) == 6 * MIB
    assert int(row.peak_allocated_bytes) == 13 * MIB - 100
    assert int(row.reserved_bytes) - int(row.allocated_bytes) == 2 * MIB + 100  # the cache at the end
    # the same from a trace that began after the 20 MiB segment was allocated
    cut = load_trace(_import(tmp_path, b.snapshot(first_entry=3), "cut"))
    assert cut.events.reserved_bytes.tolist()[:2] == [22 * MIB, 22 * MIB]
    assert int(cut.iterations.iloc[0].peak_reserved_bytes) == 22 * MIB
    del small, last


def test_a_snapshot_without_history_is_its_end_state(tmp_path):
    """``_record_memory_history(enabled="state")`` keeps no trace: one iteration, the segments' blocks."""
    run = training_snapshot()
    snapshot = run.builder.snapshot(first_entry=len(run.builder.trace))
    trace = load_trace(_import(tmp_path, snapshot))
    assert len(trace.iterations) == 1 and trace.events.event.tolist() == ["start", "end"]
    row = trace.iterations.iloc[0]
    assert int(row.peak_allocated_bytes) == WEIGHTS + ADAM + GRADS_W and int(row.peak_reserved_bytes) == SEGMENT
    assert _categories(row) == {"weights": WEIGHTS, "optimizer_state": ADAM, "weight_grads": GRADS_W}


def test_legacy_blocks_with_history(tmp_path):
    """Before PyTorch 2.1 a block's frames and requested size were in its ``history``."""
    b = Builder()
    b.segment_alloc(SEGMENT)
    b.alloc(16 * KIB - 1, weight_frames())
    snapshot = b.snapshot(first_entry=2)
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            frames, size = block.pop("frames"), block.pop("requested_size")
            block["history"] = [{"addr": segment["address"], "real_size": size, "frames": frames}]
    row = load_trace(_import(tmp_path, snapshot)).iterations.iloc[0]
    assert _categories(row) == {"weights": 16 * KIB - 1}


def test_an_oom_entry_becomes_the_post_mortem(tmp_path):
    b = Builder()
    b.segment_alloc(SEGMENT)
    b.alloc(16 * KIB, weight_frames())
    b.alloc(8 * KIB, forward_frames(("/work/torch_nn/linear.py", 125, 31)))
    b.oom(40 * MIB, 3 * MIB)
    trace = load_trace(_import(tmp_path, b.snapshot()))
    failure = trace.meta["failure"]
    assert trace.meta["status"] == "failed" and failure["kind"] == "oom"
    assert format_bytes(40 * MIB) in failure["message"] and format_bytes(3 * MIB) in failure["message"]
    assert failure["module"] == "model@train:30.linear@model:31" and failure["iteration"] == 0
    assert failure["allocated_bytes"] == 24 * KIB
    assert failure["categories"]["weights"] == 16 * KIB and failure["categories"]["feature_maps"] == 8 * KIB
    assert trace.events.event.tolist()[-5:] == ["oom", "exit", "exit", "exit", "end"]


def _two_devices() -> dict:
    zero, one = Builder(device=0), Builder(device=1)
    zero.segment_alloc(SEGMENT)
    zero.alloc(4 * KIB, train_frames())
    one.segment_alloc(4 * MIB)
    one.alloc(12 * KIB, weight_frames())
    a, b = zero.snapshot(), one.snapshot()
    return {"segments": a["segments"] + b["segments"], "device_traces": [a["device_traces"][0], b["device_traces"][1]]}


def test_several_devices_become_rank_folders_or_one_is_picked(tmp_path):
    out = _import(tmp_path, _two_devices())
    ranks = sorted(p.name for p in out.iterdir())
    assert ranks == ["rank=0", "rank=1"]
    zero, one = load_trace(out / "rank=0"), load_trace(out / "rank=1")
    assert (zero.meta["device"], one.meta["device"]) == ("cuda:0", "cuda:1")
    assert zero.meta["world_size"] == one.meta["world_size"] == 2 and one.meta["rank"] == 1
    assert int(one.iterations.iloc[0].peak_allocated_bytes) == 12 * KIB
    assert int(one.iterations.iloc[0].peak_reserved_bytes) == 4 * MIB
    picked = load_trace(_import(tmp_path, _two_devices(), "picked", device=1))
    assert picked.meta["device"] == "cuda:1" and picked.meta["world_size"] == 1
    with pytest.raises(SnapshotFormatError, match=r"no entries or segments for device 3; it has \[0, 1\]"):
        _import(tmp_path, _two_devices(), "absent", device=3)
    assert not (tmp_path / "traces" / "absent").exists()


def test_an_existing_run_is_kept_unless_forced(tmp_path):
    out = _import(tmp_path, training_snapshot(steps=1).builder.snapshot())
    stamp = (out / "meta.json").stat().st_mtime_ns
    with pytest.raises(OutputExistsError, match="pass --force"):
        _import(tmp_path, training_snapshot(steps=2).builder.snapshot())
    assert (out / "meta.json").stat().st_mtime_ns == stamp and len(load_trace(out).iterations) == 1
    _import(tmp_path, training_snapshot(steps=2).builder.snapshot(), force=True)
    assert len(load_trace(out).iterations) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]  # nothing left beside it
    (tmp_path / "empty").mkdir()
    write_snapshot(tmp_path / "s.pickle", training_snapshot(steps=1).builder.snapshot())
    assert import_snapshot(tmp_path / "s.pickle", tmp_path / "empty", run_id="named") == tmp_path / "empty"
    assert load_trace(tmp_path / "empty").run_id == "named"


def test_inconsistent_segments_are_repaired_with_a_warning(tmp_path):
    snapshot = training_snapshot(steps=1).builder.snapshot()
    first = snapshot["segments"][0]["blocks"][0]
    assert first["requested_size"] == 16 * KIB  # the first weight, allocated by the trace and never freed
    first["state"] = "inactive"
    path = tmp_path / "s.pickle"
    write_snapshot(path, snapshot)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(import_snapshot(path, tmp_path / "run"))
    assert any("disagrees with its segments" in str(w.message) for w in caught)
    assert trace.meta["snapshot"]["repairs"] == {
        "block allocated and never freed in the trace but not live in the segments": 1}
    assert int(trace.iterations.iloc[0].allocated_bytes) == WEIGHTS + ADAM + GRADS_W  # the trace's changes kept
    assert load_snapshot(path) == snapshot  # the input is never changed
