"""Crash safety: a run killed with SIGKILL, or a disk that fails mid-run, loses no completed iteration.

The kill test forks its training processes from one helper process that imported torch once, so that
each of the many kills costs a fraction of a second instead of a fresh interpreter start. The helper
reports every completed ``record_stats()`` on its stdout; the test kills the training process at a
random moment after the first one and then reads the run back with ``load_trace``.
"""

from __future__ import annotations

import errno
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import memprof.trace.format.writer
from examples import zoo
from memprof import MemoryProfiler, load_trace
from tests.memprof.helpers import TINY_MLP_WEIGHT_BYTES, assert_exact_model_bytes

KILLS = 40
SEED = 20240606
REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: imports torch once, then forks one training process per request line
# ``<out_dir> <seed> <background>`` read from stdin and reports ``pid``, ``done <i>`` and ``reaped`` lines.
FORK_SERVER = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch import nn
    from memprof import MemoryProfiler
    from examples import zoo

    torch.set_num_threads(1)

    def train(out_dir, seed, background):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        # detail for iterations 0, 3, 6 ... only: a kill lands on detailed and detail-free iterations alike
        profiler = MemoryProfiler(model, optimizer, out_dir=out_dir, run_id="run", print_period=0,
                                  background=background, detail_first=1, detail_every=3, detail_peak_rise=100.0)
        for i in range(2000):  # ends on its own should the test fail before the kill
            zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
            profiler.record_stats()
            os.write(1, f"done {i}\\n".encode())

    def warm_up(out_dir):
        # One short profiled run here pays the lazy imports and first-use costs (Adam, autograd, the
        # profiler: seconds) once, instead of in every forked child.
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0) as profiler:
            zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
            profiler.record_stats()

    import tempfile
    with tempfile.TemporaryDirectory() as warm:
        warm_up(warm)
    os.write(1, b"ready\\n")
    for line in sys.stdin:
        out_dir, seed, background = line.split()
        # The child waits until its pid is announced, so no "done" line can come before it.
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_write)
                os.read(go_read, 1)
                train(out_dir, int(seed), background == "1")
            finally:
                os._exit(3)
        os.close(go_read)
        os.write(1, f"pid {pid}\\n".encode())
        os.write(go_write, b"g")
        os.close(go_write)
        os.waitpid(pid, 0)
        os.write(1, b"reaped\\n")
    """
)


class ForkServer:
    """A helper interpreter that forks profiled training processes on request."""

    def __init__(self, script: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=REPO, bufsize=0)
        self._buffer = b""
        assert self._line(timeout_s=120) == "ready"

    def _line(self, timeout_s: float = 30.0) -> str:
        """The next line of the server's output; fails instead of hanging when none comes."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise AssertionError(f"no output from the fork server for {timeout_s} s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"fork server exited (rc {self.proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()

    def _send(self, text: str) -> None:
        self.proc.stdin.write(text.encode())

    def run_and_kill(self, out_dir: Path, seed: int, after: int, delay_s: float,
                     background: bool = True) -> list[int]:
        """Trains until ``after`` iterations completed, waits ``delay_s``, SIGKILLs; returns completed ones."""
        self._send(f"{out_dir} {seed} {int(background)}\n")
        kind, pid = self._line().split()
        assert kind == "pid"
        done: list[int] = []
        line = ""
        try:
            while len(done) < after:
                line = self._line()
                assert line.startswith("done"), f"training process ended early: {line!r}"
                done.append(int(line.split()[1]))
            time.sleep(delay_s)
        finally:
            if line != "reaped":  # still ours to kill (a reaped pid could belong to someone else by now)
                os.kill(int(pid), signal.SIGKILL)
        # Every "done" line written before the kill is still in the pipe: those iterations completed too.
        while (line := self._line()) != "reaped":
            done.append(int(line.split()[1]))
        return done

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # only the server this test started
            self.proc.wait()


def _check_sums(trace) -> None:
    assert_exact_model_bytes(trace, TINY_MLP_WEIGHT_BYTES)


def _detailed(iteration: int) -> bool:
    return iteration % 3 == 0  # the training script's policy: the first one and every third


def _check_killed_run(run_dir: Path, completed: list[int]) -> bool:
    """Asserts what a killed run must keep; returns whether the interrupted iteration was left torn."""
    trace = load_trace(run_dir)
    assert trace.meta["status"] == "running"  # close() never ran
    sets = {table: set(getattr(trace, table).iteration.tolist()) for table in ("iterations", "layers", "events")}
    last = max(completed)
    assert completed == list(range(last + 1))
    # Every reported iteration is there; at most the one being written when the kill came is extra.
    assert set(completed) <= sets["iterations"] <= set(range(last + 2)), sorted(sets["iterations"])
    detailed = {i for i in sets["iterations"] if _detailed(i)}
    assert set(trace.detail_iterations) == detailed
    for table in ("layers", "events"):  # the detail: exactly the detailed iterations, none lost
        assert sets[table] == detailed, f"{table} holds {sorted(sets[table])}, expected {sorted(detailed)}"
    _check_sums(trace)
    modules = trace.layers.groupby("iteration").module.apply(frozenset)
    assert modules.nunique() == 1 and modules.iloc[0] == frozenset({"", "0", "1", "2"})
    assert len(trace.iterations) == len(sets["iterations"])  # no iteration written twice
    # torn: the interrupted iteration reached some of the tables it belongs in, not all
    interrupted = last + 1
    belongs = [sets["iterations"]] + ([sets["layers"], sets["events"]] if _detailed(interrupted) else [])
    return len({interrupted in found for found in belongs}) > 1


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory):
    script = tmp_path_factory.mktemp("server") / "fork_server.py"
    script.write_text(FORK_SERVER)
    server = ForkServer(script)
    yield server
    server.close()


@pytest.mark.slow
def test_sigkill_at_random_moments_keeps_every_completed_iteration(fork_server, tmp_path,
                                                                  record_testsuite_property):
    rng = random.Random(SEED)
    torn, iterations_seen = 0, 0
    start = time.monotonic()
    for kill in range(KILLS):
        out_dir = tmp_path / f"kill{kill}"
        # Kill after 1..3 completed iterations, at a delay spread over several iterations (~20 ms each).
        completed = fork_server.run_and_kill(out_dir, seed=kill, after=rng.randint(1, 3),
                                             delay_s=rng.uniform(0.0, 0.15))
        torn += _check_killed_run(out_dir / "run", completed)
        iterations_seen += len(completed)
    elapsed = time.monotonic() - start
    record_testsuite_property("kills", KILLS)
    record_testsuite_property("torn_iterations", torn)
    print(f"{KILLS} SIGKILLs in {elapsed:.1f} s, {iterations_seen} completed iterations all readable; "
          f"{torn} kills left an interrupted iteration in some tables only")
    assert elapsed < 120  # about 10 s here; minutes would mean the fork server no longer saves start-up


@pytest.mark.slow
def test_sigkill_while_parts_are_merged_keeps_every_iteration_once(fork_server, tmp_path):
    # Inline processing writes one part per iteration, so every 8th iteration merges parts
    # (memprof.trace.format.compaction): the kills land before, during and after merges.
    rng = random.Random(SEED + 1)
    merged_runs, iterations_seen = 0, 0
    start = time.monotonic()
    for kill in range(KILLS // 2):
        out_dir = tmp_path / f"kill{kill}"
        completed = fork_server.run_and_kill(out_dir, seed=kill, after=rng.randint(6, 30),
                                             delay_s=rng.uniform(0.0, 0.2), background=False)
        run_dir = out_dir / "run"
        _check_killed_run(run_dir, completed)
        before = load_trace(run_dir)
        memprof.trace.format.writer.TraceWriter(run_dir)  # what a takeover does: clears a killed merge's leftovers
        after = load_trace(run_dir)
        for table in ("iterations", "layers", "events"):
            pd.testing.assert_frame_equal(getattr(after, table), getattr(before, table))
        parts = list((run_dir / "events.parquet").glob("part-*.parquet"))
        assert not list((run_dir / "events.parquet").glob(".*"))
        merged_runs += len(parts) < len(after.iterations)
        iterations_seen += len(completed)
    print(f"{KILLS // 2} SIGKILLs of inline runs in {time.monotonic() - start:.1f} s, {iterations_seen} completed "
          f"iterations all readable once; {merged_runs} runs had merged parts")
    assert merged_runs >= KILLS // 4  # most runs got past their first merge


class _Killed(BaseException):
    """Stands for the process dying between two file writes (nothing after it runs)."""


def test_death_between_table_parts_leaves_consistent_tables(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # inline: the parts are written in this process, where the test can cut the writes short
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="run", print_period=0, background=False)
    original = memprof.trace.format.writer.TraceWriter.append

    def append(self, table, data):
        path = original(self, table, data)
        if profiler.iteration == 2 and path is not None:
            raise _Killed  # the first part of iteration 2 reached the disk, then the process died
        return path

    try:
        for _ in range(3):
            zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
            monkeypatch.setattr(memprof.trace.format.writer.TraceWriter, "append", append)
            try:
                profiler.record_stats()
            except _Killed:
                break
        trace = load_trace(tmp_path / "run")
        sets = [set(getattr(trace, t).iteration) for t in ("iterations", "layers", "events")]
        assert sets[0] >= {0, 1}
        assert sets[0] == sets[1] == sets[2], f"iterations/layers/events disagree: {sets}"
    finally:
        monkeypatch.undo()
        profiler.close()


def _failing_writes(monkeypatch, fails, code: int = errno.ENOSPC) -> None:
    """Makes the trace writer's ``write_atomically(path, ...)`` raise ``OSError(code)`` whenever ``fails(path)``."""
    original = memprof.trace.format.writer.write_atomically

    def write(path, data, *args, **kwargs):
        if fails(Path(path)):
            raise OSError(code, os.strerror(code), str(path))
        return original(path, data, *args, **kwargs)

    monkeypatch.setattr(memprof.trace.format.writer, "write_atomically", write)


def _train(profiler: MemoryProfiler, model: nn.Module, optimizer, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,)))))
        profiler.record_stats()
    return losses


def _memprof_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "memprof" in str(w.message)]


def test_disk_full_is_reported_once_and_training_continues(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="run", print_period=0,
                                  background=False)
        _train(profiler, model, optimizer, 2)  # iterations 0 and 1 reach the disk
        disk_full = [True]
        _failing_writes(monkeypatch, lambda path: disk_full[0])
        losses = _train(profiler, model, optimizer, 3)  # iterations 2-4 cannot be written
        disk_full[0] = False  # space was freed
        losses += _train(profiler, model, optimizer, 2)
        profiler.close()
    assert len(losses) == 5 and all(np.isfinite(losses))  # training went on
    reported = _memprof_warnings(caught)
    assert len(reported) == 1, reported
    assert "No space left on device" in reported[0] and str(profiler.run_dir) in reported[0]
    trace = load_trace(tmp_path / "run")
    assert trace.meta["status"] == "closed" and trace.meta["iterations"] == 7
    # What reached the disk before the failure is intact; iterations after the recovery are written again.
    assert {0, 1, 5, 6} <= set(trace.iterations.iteration) <= set(range(7))
    _check_sums(trace)


def test_failed_flush_leaves_tables_consistent(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="run", print_period=0,
                                  background=False)
        _train(profiler, model, optimizer, 1)
        # Iteration 1: the layers part cannot be written (e.g. the disk fills up right then).
        _failing_writes(monkeypatch, lambda path: profiler.iteration == 1 and "layers" in path.parent.name)
        _train(profiler, model, optimizer, 2)
        profiler.close()
    trace = load_trace(tmp_path / "run")
    sets = [set(getattr(trace, t).iteration) for t in ("iterations", "layers", "events")]
    assert sets[0] == sets[1] == sets[2] == {0, 2}, sets


def test_vanished_run_directory_is_reported_once_and_training_continues(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="run", print_period=0)
        _train(profiler, model, optimizer, 1)
        shutil.rmtree(profiler.run_dir)  # e.g. a cleanup job removed the folder, or the mount went away
        losses = _train(profiler, model, optimizer, 3)
        profiler.close()
    assert len(losses) == 3 and profiler.iteration == 4
    reported = _memprof_warnings(caught)
    # One report while training; close() may add one more for meta.json, never one per iteration.
    assert 1 <= len(reported) <= 2, reported
    assert all(str(profiler.run_dir) in message for message in reported)
