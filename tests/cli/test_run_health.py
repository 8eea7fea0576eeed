"""The commands that read a run say what the reader knows: a damaged part once, on stderr, wherever it lies
(also in a table the command never reads), and an interrupted or still running run before its numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from memprof.trace.liveness import writer_record
from memprof.trace.parts import table_parts
from tests.bad_input import run_cli
from tests.cli.helpers import printed_warnings
from tests.dashboard.fixtures import write_profiled_run

ROOT = Path(__file__).parents[2]
DAMAGED_PAGE = ("run syn: 1 damaged part skipped: lost the timeline of iteration 1 "
                "(events.parquet/part-000002.parquet: a damaged page (failed its checksum)); 2 of 3 iterations are "
                "intact.")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A readable run of 3 iterations (one part per iteration and table)."""
    write_profiled_run(tmp_path / "syn", "syn", iterations=3)
    return tmp_path / "syn"


def _damage_page(part: Path) -> None:
    """Flips the first page header (right after the "PAR1" magic): the footer stays sound, so the damage is
    found only when the part is read."""
    raw = bytearray(part.read_bytes())
    raw[8:16] = bytes(b ^ 0xFF for b in raw[8:16])
    part.write_bytes(bytes(raw))


def _run(argv: list[str]) -> tuple[int, str, str, list[str]]:
    """``memprof ARGV`` in this process: exit code, stdout, stderr and the damage warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli(argv)
    return code, out, err, [str(w.message) for w in caught if "damaged part" in str(w.message)]


@pytest.mark.parametrize("command", ["report", "plan", "export-snapshot"])
def test_a_damaged_page_in_a_part_the_command_does_not_need_is_said_once(run, tmp_path, command):
    _damage_page(table_parts(run, "events")[1])  # iteration 1's timeline: neither report nor plan reads it
    extra = {"report": [], "plan": ["--budget", "64MiB", "--out", str(tmp_path / "s.json")],
             "export-snapshot": ["--out", str(tmp_path / "s.pickle")]}[command]
    code, out, err, said = _run([command, str(run), *extra])
    assert code == 0 and "Traceback" not in out + err, err
    assert said == [DAMAGED_PAGE]  # one warning, the reader's own words
    with printed_warnings():
        code, out, err = run_cli([command, str(run), *extra, *(["--force"] if command == "export-snapshot" else [])])
    assert code == 0 and err == f"memprof {command}: warning: {DAMAGED_PAGE}\n"  # the one line a user sees
    assert out  # and the command carried on with what is intact


def test_a_footer_and_a_page_damaged_are_one_line_naming_both(run):
    table_parts(run, "layers")[0].write_bytes(b"not parquet")  # found when the run is opened
    _damage_page(table_parts(run, "events")[1])  # found when it is read
    code, _, err, said = _run(["report", str(run)])
    assert code == 0 and len(said) == 1, said
    assert said[0].startswith("run syn: 2 damaged parts skipped: lost the layer detail of iteration 0 ")
    assert "the timeline of iteration 1 (events.parquet/part-000002.parquet" in said[0]
    with printed_warnings():
        assert len(run_cli(["report", str(run)])[2].splitlines()) == 1


def test_a_sound_run_says_nothing(run):
    code, out, err, said = _run(["report", str(run)])
    assert (code, err, said) == (0, "", []) and out.startswith("run syn | model Net | 3 iterations")


def _mark_running(run: Path, writer: dict) -> None:
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running", "writer": writer}))


def test_a_run_whose_writer_died_is_reported_as_interrupted_first(run):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = writer_record(child.pid)
    child.wait()  # exited and reaped: its pid names no process
    _mark_running(run, record)
    code, out, err = run_cli(["report", str(run)])
    assert code == 0 and err == ""
    assert out.splitlines()[0] == ("run syn was INTERRUPTED: its process ended without closing it (killed or "
                                   "crashed); iterations 0-2 are complete, and only those are shown")
    assert out.splitlines()[1].startswith("run syn | model Net | 3 iterations")


def test_a_run_whose_writer_lives_is_reported_as_running(run):
    _mark_running(run, writer_record())  # this process writes it
    out = run_cli(["report", str(run)])[1]
    assert out.splitlines()[0] == (f"run syn is still RUNNING (process {os.getpid()} is writing it); iterations "
                                   "0-2 are complete so far, and only those are shown")
    _mark_running(run, {**writer_record(), "host": "another-host"})  # cannot be told from here
    assert "is marked RUNNING, but whether its process is alive cannot be told" in run_cli(["report", str(run)])[1]


def test_a_closed_run_has_no_state_line(run):
    out = run_cli(["report", str(run)])[1]
    assert "INTERRUPTED" not in out and "RUNNING" not in out


TRAIN = textwrap.dedent("""
    import sys, time
    import torch
    from torch import nn
    from examples import zoo
    from memprof import MemoryProfiler

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = MemoryProfiler(model, optimizer, out_dir=sys.argv[1], run_id="killed", print_period=0,
                              background=False)
    for i in range(3):
        zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
        profiler.record_stats()
    print("done", flush=True)
    time.sleep(600)  # killed here, never closed
""")


@pytest.mark.slow
def test_memprof_report_of_a_run_killed_with_sigkill(tmp_path):
    """The issue's case as a user meets it: training killed with SIGKILL, then ``memprof report`` from a shell."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == b"done"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads((tmp_path / "killed" / "meta.json").read_text())["status"] == "running"
    started = time.monotonic()
    shown = subprocess.run([sys.executable, "-m", "cli", "report", str(tmp_path / "killed")], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=300)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert shown.stdout.splitlines()[0] == ("run killed was INTERRUPTED: its process ended without closing it "
                                            "(killed or crashed); iterations 0-2 are complete, and only those are "
                                            "shown"), (shown.stdout, time.monotonic() - started)


def test_a_distributed_runs_report_names_its_interrupted_rank(tmp_path):
    for rank in (0, 1):
        write_profiled_run(tmp_path / "ddp" / f"rank={rank}", "ddp", iterations=2 + rank, scale=1 + rank, rank=rank,
                           world_size=2)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = writer_record(child.pid)
    child.wait()
    _mark_running(tmp_path / "ddp" / "rank=1", record)
    code, out, err = run_cli(["report", str(tmp_path / "ddp")])
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("run ddp | model Net | 2 ranks")
    assert lines[1] == ("rank 1 was INTERRUPTED (its process ended without closing it): its 3 complete "
                        "iterations are shown")
    assert sum("INTERRUPTED" in line or "RUNNING" in line for line in lines) == 1  # rank 0 closed: nothing said
