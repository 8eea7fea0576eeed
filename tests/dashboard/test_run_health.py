"""Damaged, interrupted and live runs in the dashboard, the Runs table's grouping, and the timeline's drill-down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from dashboard import callbacks as cb
from dashboard.data import TraceStore, plain_message
from dashboard.drilldown import clicked_seq, tensors_view
from dashboard.live import live_switch, live_tick, problem_view
from dashboard.runs import RUN_COLUMN_WIDTHS_PX, RUNS_TABLE_MAX_PX, group_runs
from examples import zoo
from memprof import MemoryProfiler
from memprof.trace.liveness import writer_record
from memprof.trace.parts import table_parts
from tests.dashboard.fixtures import Traces

pytestmark = pytest.mark.filterwarnings("ignore:run .* damaged part:RuntimeWarning")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """A real run: 12 iterations, detail for 0, 1, 5 and 10, stacks for outputs of 4 KiB or more."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    root = tmp_path_factory.mktemp("traces")
    with MemoryProfiler(model, optimizer, out_dir=root, run_id="real", print_period=0, background=False,
                        detail_first=2, detail_every=5, stack_min_bytes=4096) as profiler:
        for _ in range(12):
            zoo.train_step(model, optimizer, (torch.randn(32, 64), torch.randint(0, 4, (32,))))
            profiler.record_stats()
    return root


def _copy(root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(root, tmp_path / "traces"))


def test_a_damaged_run_opens_and_every_view_says_the_same_line(profiled, tmp_path):
    root = _copy(profiled, tmp_path)
    table_parts(root / "real", "events")[0].write_bytes(os.urandom(2000))  # the timeline of iteration 0
    store = TraceStore(root)
    problem = store.problem("real")
    assert problem.startswith("Run real: 1 damaged part skipped: lost the timeline of iteration 0 ")
    assert str(root) not in problem and "Arrow" not in problem and "Error" not in problem
    assert problem_view(store, ["real"]) == (problem, {"display": "block"})
    row = next(store.summary(e) for e in store.runs() if e.name == "real")
    assert row["iterations"] == 12 and row["error"] == problem and row["state"] == "closed"
    text, peaks, _ = cb.overview_view(store, ["real"])
    assert text.startswith("Peak ") and len(peaks.data)  # the overview is intact
    assert 0 not in store.detail_iterations("real").tolist()  # its timeline is gone: not offered
    options, value = cb.iteration_options(store, ["real"])
    assert [o["value"] for o in options] == [1, 5, 10] and value in (1, 5, 10)
    assert cb.timeline_view(store, ["real"], value)[0].data  # the other timelines draw


def test_an_unreadable_run_has_one_line_without_paths(traces: Traces):
    store = TraceStore(traces.root)
    line = store.problem("corrupt")
    assert line.startswith("Run corrupt cannot be opened: corrupt/meta.json is not valid JSON")
    assert str(traces.root) not in line
    row = next(store.summary(e) for e in store.runs() if e.name == "corrupt")
    assert row["iterations"] is None and row["state"] == "unreadable" and str(traces.root) not in row["error"]
    assert plain_message(f"{traces.root}/x/meta.json: ArrowInvalid: bad", traces.root) == "x/meta.json: bad"


def test_an_interrupted_run_is_marked_and_explained(traces: Traces):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = writer_record(child.pid)
    child.wait()
    meta_path = traces.root / "mlp" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "status": "running", "writer": record}))
    store = TraceStore(traces.root)
    row = next(store.summary(e) for e in store.runs() if e.name == "mlp")
    assert row["state"] == "interrupted"
    assert store.problem("mlp") == ("Run mlp: its process ended without closing it (killed or crashed); "
                                    "the 3 iterations it completed are shown.")
    assert live_switch(store, ["mlp"]) is True  # a dead writer: no refresh


def test_a_live_run_turns_the_refresh_on_and_reads_only_new_parts(traces: Traces):
    meta_path = traces.root / "mlp" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "status": "running", "writer": writer_record()}))  # this process
    store = TraceStore(traces.root)
    assert live_switch(store, ["mlp"]) is False
    first, stop = live_tick(store, ["mlp"], None)
    assert first["run"] == "mlp" and stop is False
    assert live_tick(store, ["mlp"], first) == (None, False)  # nothing new: no redraw
    before = len(store.iterations("mlp"))
    reads = _count_part_reads(store, lambda: _append_iteration(traces.root / "mlp", before))
    second, _ = live_tick(store, ["mlp"], first)
    assert second is not None and second != first
    assert len(store.iterations("mlp")) == before + 1
    assert reads() == {"iterations": 1}  # one new part read; the old ones came from the part cache
    meta_path.write_text(json.dumps({**meta, "status": "closed"}))
    assert live_tick(store, ["mlp"], second)[1] is True  # closed: the interval stops


def _append_iteration(run_dir: Path, iteration: int) -> None:
    from memprof.trace.format.writer import TraceWriter
    from tests.dashboard.fixtures import activation_profile, event_rows, iteration_row, layer_rows

    writer = TraceWriter(run_dir)
    events = event_rows(iteration, activation_profile())
    writer.append("layers", layer_rows(iteration))
    writer.append("events", events)
    writer.append("iterations", [iteration_row(iteration, events)])


def _count_part_reads(store: TraceStore, change):
    """Runs ``change``, then counts (per table) the part reads the store's cache misses afterwards."""
    import memprof.trace.parts as parts

    store.iterations("mlp")  # everything there is now is cached
    change()
    counts: dict[str, int] = {}
    original = parts._read_part

    def counting(path, table, *args):
        counts[table] = counts.get(table, 0) + 1
        return original(path, table, *args)

    parts._read_part = counting
    return lambda: (setattr(parts, "_read_part", original), store.iterations("mlp"), counts)[2]


def test_measured_runs_are_grouped_under_their_source_newest_first():
    rows = [
        {"name": "a", "run_id": "a", "source": "", "created": "2026-01-01 10:00:00"},
        {"name": "a-m1", "run_id": "a-m1", "source": "a", "created": "2026-01-01 11:00:00"},
        {"name": "b", "run_id": "b", "source": "", "created": "2026-01-02 10:00:00"},
        {"name": "a-m2", "run_id": "a-m2", "source": "a", "created": "2026-01-03 10:00:00"},
        {"name": "orphan", "run_id": "orphan", "source": "gone", "created": "2026-01-01 12:00:00"},
    ]
    assert [r["name"] for r in group_runs(rows)] == ["b", "orphan", "a", "a-m2", "a-m1"]
    assert sum(RUN_COLUMN_WIDTHS_PX.values()) + 40 <= RUNS_TABLE_MAX_PX  # the checkbox column included


def test_runs_view_puts_the_measured_run_under_its_source(traces: Traces):
    rows, _, _, _ = cb.runs_view(TraceStore(traces.root))
    names = [r["name"] for r in rows]
    assert names[names.index("mlp") + 1] == "mlp-measured"


def test_a_click_on_the_timeline_lists_the_live_tensors_largest_first(profiled):
    store = TraceStore(profiled)
    frame = store.timeline("real", 5)
    at = int(frame["allocated_bytes"].idxmax())
    click = {"points": [{"x": float(frame["time_ms"].iloc[at]) + 1e-6}]}
    assert clicked_seq(store, "real", 5, click) == int(frame["seq"].iloc[at])
    rows, tips, note = tensors_view(store, ["real"], 5, click)
    sizes = [r["bytes"] for r in rows]
    assert sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == int(frame["allocated_bytes"].iloc[at])  # the tensors add up to the allocator's total
    assert {"weights", "optimizer_state"} <= {r["category"] for r in rows}
    made = [r for r in rows if r["op"].startswith("torch.")]
    big = [r for r in made if r["bytes"] >= 4096]  # the threshold of this run: these carry their stack
    assert big and all(r["called_from"] for r in big) and not any(r["called_from"] for r in made if r["bytes"] < 4096)
    tip = tips[rows.index(big[0])]["called_from"]
    assert tip["type"] == "text" and tip["value"].splitlines()[-1] == big[0]["called_from"]  # the whole stack
    grads = [r for r in rows if r["category"] == "weight_grads"]
    assert grads and all(r["op"] == "(autograd backward)" and r["module"] != "(none)" for r in grads)
    weight = next(r for r in rows if r["category"] == "weights" and r["bytes"] == 64 * 256 * 4)
    assert weight["op"] == "(before the iteration)" and weight["phase"] == "before"
    assert note.startswith(f"{len(rows)} tensors alive at ") and "iteration 5" in note
    assert tensors_view(store, ["real"], 5, None)[2].startswith("Click a point")


def test_no_stacks_are_captured_in_iterations_without_detail(profiled):
    from memprof import load_trace

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = load_trace(profiled / "real")
        assert sorted(set(trace.read("stacks")["iteration"])) == [0, 1, 5, 10]
        assert sorted(set(trace.read("allocations")["iteration"])) == [0, 1, 5, 10]
    stacks = trace.read("stacks")
    assert (stacks.loc[stacks["bytes"] < 4096, "stack"] == "").all()
    assert (stacks.loc[stacks["bytes"] >= 4096, "stack"] != "").all()
