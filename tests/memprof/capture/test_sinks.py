"""The background worker: same trace as inline processing, and nothing lost when it or the trainer dies."""

from __future__ import annotations

import os
import signal
import time
import warnings

import pytest
import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.capture import sinks, worker_judge
from memprof.trace.pipeline.journal import JOURNAL_DIR, STATE_FILE
from memprof.trace.reader import read_meta, table_parts
from tests.memprof.helpers import CATEGORIES, TINY_MLP_WEIGHT_BYTES, assert_exact_model_bytes


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(profiler: MemoryProfiler, model: nn.Module, optimizer, steps: int) -> None:
    for _ in range(steps):
        zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
        profiler.record_stats()


def _check(trace, iterations: int) -> None:
    assert trace.iterations.iteration.tolist() == list(range(iterations))
    assert_exact_model_bytes(trace, TINY_MLP_WEIGHT_BYTES)
    assert trace.layers.groupby("iteration").size().nunique() == 1  # every iteration once, whole


def _memprof_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "memprof" in str(w.message)]


def test_background_and_inline_write_the_same_trace(tmp_path):
    traces = {}
    for background in (True, False):
        model, optimizer = _model()
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=background) as profiler:
            _train(profiler, model, optimizer, 5)
        traces[background] = load_trace(profiler.run_dir)
        assert traces[background].meta["processing"] == ("background" if background else "inline")
        assert not (profiler.run_dir / JOURNAL_DIR).exists()  # the journal is gone once all is written
    bg, inline = traces[True], traces[False]
    exact = ["iteration", "epoch", "peak_allocated_bytes", "allocated_bytes", "num_events", "num_allocations",
             "peak_module", "peak_phase", *CATEGORIES]
    assert bg.iterations[exact].equals(inline.iterations[exact])
    columns = ["iteration", "module", "weight_bytes", "weight_grad_bytes", "feature_map_bytes", "saved_bytes",
               "output_bytes", "forward_overhead_bytes", "backward_overhead_bytes"]
    assert bg.layers[columns].equals(inline.layers[columns])
    columns = ["iteration", "seq", "phase", "module", "event", "allocated_bytes", "peak_bytes", *CATEGORIES]
    assert bg.events[columns].equals(inline.events[columns])


def test_a_killed_worker_is_taken_over_without_losing_an_iteration(tmp_path):
    model, optimizer = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
        _train(profiler, model, optimizer, 3)
        os.kill(profiler._sink.pid, signal.SIGKILL)
        _train(profiler, model, optimizer, 4)
        profiler.close()
    reported = _memprof_warnings(caught)
    assert len(reported) == 1 and "background worker" in reported[0] and str(profiler.run_dir) in reported[0]
    trace = load_trace(profiler.run_dir)
    assert trace.meta["processing"] == "inline" and trace.meta["status"] == "closed"
    _check(trace, 7)


def test_a_worker_killed_after_answering_all_it_was_told_is_found_at_the_next_wake_up(tmp_path):
    """The training process reads the worker's pipe only while answers are owed: a worker that dies with none
    owed is found when it is next woken (its pipe broken), and nothing is lost."""
    model, optimizer = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
        try:
            _train(profiler, model, optimizer, sinks.WAKE_RECORDS)  # the last of these wakes it
            deadline = time.monotonic() + 60
            while profiler._sink._reported < profiler._sink._told and time.monotonic() < deadline:
                time.sleep(0.2)
                _train(profiler, model, optimizer, 1)  # (answers are read in record_stats())
            assert profiler._sink._reported == profiler._sink._told and profiler._sink.mode == "background"
            os.kill(profiler._sink.pid, signal.SIGKILL)
            profiler._sink._proc.process.wait()
            _train(profiler, model, optimizer, sinks.WAKE_RECORDS)  # wakes it again on the way: its pipe is broken
            assert profiler._sink.mode == "inline"
        finally:
            profiler.close()
    reported = _memprof_warnings(caught)
    assert len(reported) == 1 and "background worker" in reported[0], reported
    trace = load_trace(profiler.run_dir)
    assert trace.meta["processing"] == "inline" and trace.meta["status"] == "closed"
    _check(trace, profiler.iteration)


def test_a_run_killed_with_its_worker_is_finished_by_the_reader(tmp_path):
    model, optimizer = _model()
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
    try:
        _train(profiler, model, optimizer, 5)
        os.kill(profiler._sink.pid, signal.SIGKILL)  # before it wrote its first batch (16, or 0.5 s idle)
        assert (profiler.run_dir / JOURNAL_DIR).is_dir()
        written = len(table_parts(profiler.run_dir, "iterations"))
        trace = load_trace(profiler.run_dir)
        assert trace.meta["status"] == "running"
        _check(trace, 5)  # the reader analysed the journaled iterations the worker never wrote
        assert len(table_parts(profiler.run_dir, "iterations")) == written  # and wrote nothing itself
        # a damaged journal: a warning, and the written tables stay readable
        (profiler.run_dir / JOURNAL_DIR / STATE_FILE).write_bytes(b"not a state")
        with pytest.warns(RuntimeWarning, match="could not finish the journal"):
            damaged = load_trace(profiler.run_dir)
        assert len(damaged.iterations) <= 5
    finally:
        (profiler.run_dir / JOURNAL_DIR / STATE_FILE).unlink(missing_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            profiler.close()


def test_reports_reach_the_stream_by_close(tmp_path, capsys):
    model, optimizer = _model()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=1) as profiler:
        _train(profiler, model, optimizer, 4)
    out = capsys.readouterr().out
    assert [line.split()[3] for line in out.splitlines() if line.startswith("memprof | iteration")] == \
        ["0", "1", "2", "3"]


def test_a_worker_that_cannot_write_is_reported_once_and_training_goes_on(tmp_path):
    model, optimizer = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
        (profiler.run_dir / "layers.parquet").write_bytes(b"")  # a file where the worker needs a folder
        _train(profiler, model, optimizer, 3)
        time.sleep(1.0)  # the worker writes its batch when training pauses
        _train(profiler, model, optimizer, 3)
        profiler.close()
    reported = _memprof_warnings(caught)
    assert len(reported) == 1 and "could not write the trace" in reported[0], reported
    assert profiler.iteration == 6 and read_meta(profiler.run_dir)["status"] == "closed"


def test_a_worker_that_fails_is_replaced_by_inline_processing(tmp_path):
    model, optimizer = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
        (profiler.run_dir / JOURNAL_DIR / "spec.json").write_text("{}")  # the worker cannot start on this
        _train(profiler, model, optimizer, 4)
        profiler.close()
    reported = _memprof_warnings(caught)
    assert len(reported) == 1 and "stopped (it failed: CorruptTraceError" in reported[0], reported
    trace = load_trace(profiler.run_dir)
    assert trace.meta["processing"] == "inline"
    _check(trace, 4)


def _switching(monkeypatch) -> None:
    """The worker judged over 4 answered records after the first 4, and always found behind."""
    monkeypatch.setattr(worker_judge, "SETTLE_RECORDS", 4)
    monkeypatch.setattr(worker_judge, "JUDGE_RECORDS", 4)
    monkeypatch.setattr(worker_judge, "INLINE_WAIT_SHARE", 0.0)


def _until_switched(profiler: MemoryProfiler, model: nn.Module, optimizer, most: int = 200) -> int:
    """Trains until the records went to the training thread (at most ``most`` steps); how many steps it took. The
    worker's answers are waited for, so that a machine busy with other tests cannot keep it from being judged."""
    steps = 0
    while profiler._sink.mode == "background" and steps < most:
        _train(profiler, model, optimizer, 1)
        steps += 1
        sink = profiler._sink
        if sink.mode == "background" and sink._reported < sink._told:
            profiler._handle(sink._read(block=True))
    return steps


def test_a_worker_training_waits_for_hands_the_records_to_the_training_thread(tmp_path, monkeypatch):
    _switching(monkeypatch)
    traces, steps = {}, 0
    for switching in (True, False):
        monkeypatch.setattr(worker_judge, "INLINE_WAIT_SHARE", 0.0 if switching else float("inf"))
        model, optimizer = _model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
                if switching:
                    steps = _until_switched(profiler, model, optimizer) + 11
                    _train(profiler, model, optimizer, 11)
                else:  # the same steps, the worker kept
                    _train(profiler, model, optimizer, steps)
                assert profiler._sink.mode == ("inline" if switching else "background")
        assert not _memprof_warnings(caught)  # a switch is no failure
        traces[switching] = trace = load_trace(profiler.run_dir)
        assert not (profiler.run_dir / JOURNAL_DIR).exists()
        _check(trace, steps)
    switched = traces[True].meta["processing_switch"]
    assert traces[True].meta["processing"] == "inline" and "processing_switch" not in traces[False].meta
    assert 8 <= switched["iteration"] <= steps - 11 and switched["records"] >= 4 and switched["worker_cpu_ms"] > 0
    exact = ["iteration", "peak_allocated_bytes", "allocated_bytes", "num_allocations", "peak_module", *CATEGORIES]
    assert traces[True].iterations[exact].equals(traces[False].iterations[exact])


def test_a_run_killed_after_its_records_went_to_the_training_thread_is_finished_by_the_reader(tmp_path, monkeypatch):
    _switching(monkeypatch)
    model, optimizer = _model()
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
    try:
        steps = _until_switched(profiler, model, optimizer)
        _train(profiler, model, optimizer, 11)  # some analysed and not written, some not analysed yet
        sink = profiler._sink._inline
        assert isinstance(sink, sinks.JournaledSink) and sink.waiting and sink.batch
        trace = load_trace(profiler.run_dir)  # as a killed run's: the reader finishes the journal
        assert trace.meta["status"] == "running"
        _check(trace, steps + 11)
    finally:
        profiler.close()


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="reads a process's CPU time from /proc")
def test_a_worker_that_gets_no_cpu_is_taken_over_in_seconds_not_after_the_stall(tmp_path, monkeypatch):
    """A stopped worker runs no CPU time, as an idle-priority one does on a machine whose cores other processes keep
    busy: training waits for it only ``STARVED_S``, not the 120 s a silent worker is given, and loses nothing."""
    monkeypatch.setattr(sinks, "STARVED_S", 1.0)
    monkeypatch.setattr(worker_judge, "INLINE_WAIT_SHARE", float("inf"))  # no switch by the judge's windows
    model, optimizer = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
        _train(profiler, model, optimizer, 3)
        os.kill(profiler._sink.pid, signal.SIGSTOP)
        started = time.monotonic()
        _train(profiler, model, optimizer, sinks.MAX_PENDING + 4)  # more than it may owe: training waits for it
        waited = time.monotonic() - started
        assert profiler._sink.mode == "inline"
        profiler.close()
    assert waited < 30, waited  # (the stall rule alone: 120 s)
    reported = _memprof_warnings(caught)
    assert len(reported) == 1 and "ran no CPU time for 1 s" in reported[0], reported
    trace = load_trace(profiler.run_dir)
    assert trace.meta["processing"] == "inline" and trace.meta["status"] == "closed"
    _check(trace, 3 + sinks.MAX_PENDING + 4)
