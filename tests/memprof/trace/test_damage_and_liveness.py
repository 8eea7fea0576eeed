"""A damaged part costs only its iterations (one warning naming them); a run whose writer died reads as interrupted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from examples import zoo
from memprof import CorruptTraceError, MemoryProfiler, list_runs, load_trace
from memprof.trace.damage import PartDamage, damage_message, format_iterations, lost_iterations
from memprof.trace.liveness import run_state, writer_alive, writer_record
from memprof.trace.parts import table_parts

REPO = Path(__file__).resolve().parents[3]
STEPS = 30


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> Path:
    """30 iterations, each with detail, written inline: parts of 8 iterations merged, then one per iteration."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("traces"), run_id="long", print_period=0,
                        background=False, detail_every=1) as profiler:
        for _ in range(STEPS):
            zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
            profiler.record_stats()
    return profiler.run_dir


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


def _open(run: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(run)
        frames = (trace.iterations, trace.layers, trace.events)
    return trace, frames, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_garbage_events_part_costs_only_the_timeline_of_its_iterations(long_run, tmp_path):
    run = _copy(long_run, tmp_path)
    part = table_parts(run, "events")[0]
    assert part.name == "part-000008.t1-000001.parquet"  # iterations 0-7, merged
    part.write_bytes(os.urandom(3000))
    trace, (iterations, layers, events), said = _open(run)
    assert len(said) == 1, said  # one warning for the run
    assert said[0] == f"run long: {trace.damage_message}"
    assert trace.damage == (PartDamage("events", "events.parquet/part-000008.t1-000001.parquet",
                                       trace.damage[0].reason, tuple(range(8))),)
    assert "iterations 0-7" in said[0] and "22 of 30 iterations are intact" in said[0]
    assert str(tmp_path) not in said[0] and "Arrow" not in said[0] and "Error" not in said[0]
    assert iterations.iteration.tolist() == list(range(STEPS))  # the summary rows are intact
    assert sorted(set(events.iteration)) == list(range(8, STEPS))
    assert sorted(set(layers.iteration)) == list(range(STEPS))
    with pytest.raises(CorruptTraceError, match="part-000008.t1-000001.parquet"):
        load_trace(run, strict=True)


def test_a_garbage_iterations_part_loses_those_iterations_entirely(long_run, tmp_path):
    run = _copy(long_run, tmp_path)
    table_parts(run, "iterations")[1].write_bytes(b"not parquet")  # iterations 8-15
    trace, (iterations, layers, events), said = _open(run)
    assert len(said) == 1 and "lost iterations 8-15 entirely" in said[0], said
    assert trace.damage[0].iterations == tuple(range(8, 16))
    kept = [*range(8), *range(16, STEPS)]
    assert iterations.iteration.tolist() == kept
    assert sorted(set(events.iteration)) == kept and sorted(set(layers.iteration)) == kept


def test_a_damaged_page_is_found_when_read_and_skipped(long_run, tmp_path):
    run = _copy(long_run, tmp_path)
    part = table_parts(run, "layers")[2]  # iterations 16-23
    raw = bytearray(part.read_bytes())
    raw[8:16] = bytes(b ^ 0xFF for b in raw[8:16])  # the first page header: the footer stays sound
    part.write_bytes(bytes(raw))
    trace, (iterations, layers, _), said = _open(run)
    assert len(said) == 1 and "layer detail of iterations 16-23" in said[0], said
    assert len(iterations) == STEPS and sorted(set(layers.iteration)) == [*range(16), *range(24, STEPS)]


def test_lost_iterations_lie_between_the_readable_neighbours():
    ranges = [(0, 7), None, (16, 23), (24, 24)]
    assert lost_iterations(1, ranges, range(30)) == tuple(range(8, 16))
    assert lost_iterations(3, [(0, 7), None, None, None], [0, 9, 12]) == (9, 12)  # the last parts: up to the end
    assert format_iterations([5, 1, 2, 3, 9]) == "1-3, 5, 9"
    assert damage_message([]) is None
    line = damage_message([PartDamage("ops", "ops.parquet/part-000001.parquet", "unreadable")], 3)
    assert line == ("1 damaged part skipped: lost the recorded ops of the planning pass "
                    "(ops.parquet/part-000001.parquet: unreadable); 3 of 3 iterations are intact.")


# ------------------------------------------------------------------------------------------ liveness

def test_writer_record_names_a_living_process_and_not_a_dead_one():
    assert writer_alive(writer_record()) is True
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = writer_record(child.pid)
    child.wait()
    assert writer_alive(record) is False  # exited (and reaped): its pid names no process
    assert writer_alive({**writer_record(), "start_ticks": -1}) is False  # the pid is reused by another process
    assert writer_alive({**writer_record(), "host": "another-host"}) is None  # cannot tell from here
    assert writer_alive(None) is None
    assert run_state({"status": "running"}) == "running"  # no record (older traces): taken at its word
    assert run_state({"status": "closed", "writer": record}) == "closed"
    assert run_state({"status": "running", "writer": record}) == "interrupted"
    assert run_state({}) == "closed"


TRAIN = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch import nn
    from examples import zoo
    from memprof import MemoryProfiler

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = MemoryProfiler(model, optimizer, out_dir=sys.argv[1], run_id="killed", print_period=0,
                              background=bool(int(sys.argv[2])))
    for i in range(3):
        zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
        profiler.record_stats()
    print("done", flush=True)
    time.sleep(600)  # killed here, never closed
""")


@pytest.mark.parametrize("background", [False, True], ids=["inline", "worker"])
def test_a_run_killed_with_sigkill_is_listed_as_interrupted(tmp_path, background):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "traces"), str(int(background))],
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == b"done"
        run = tmp_path / "traces" / "killed"
        assert load_trace(run).state == "running"
        assert [entry.state for entry in list_runs(tmp_path / "traces")] == ["running"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30
    while background and len(load_trace(run).iterations) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # the worker finishes the journal after the training process died
    trace = load_trace(run)
    assert trace.meta["status"] == "running"  # what the killed process left in meta.json ...
    assert trace.state == "interrupted"  # ... and what the reader knows
    assert [(entry.name, entry.state) for entry in list_runs(tmp_path / "traces")] == [("killed", "interrupted")]
    assert trace.iterations.iteration.tolist() == [0, 1, 2]
