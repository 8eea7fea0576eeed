"""The background worker's economy: a journal read once when behind, records in gathers, its CPU accounted for."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from memprof.capture.sinks import WAKE_RECORDS, BackgroundSink
from memprof.trace.pipeline import journal
from memprof.trace.pipeline.journal import JournalReader, JournalWriter
from memprof.trace.pipeline.worker import PRIORITY_ENV, Stages
from tests.memprof.trace.pipeline.test_journal import _record, _same


def test_a_reader_that_fell_behind_reads_the_segment_once(tmp_path, monkeypatch):
    writer = JournalWriter(tmp_path)
    records = [_record(i) for i in range(10)]
    for record in records:
        writer.append(record)
    writer.close()
    reads = []
    original = JournalReader._read
    monkeypatch.setattr(JournalReader, "_read", lambda self, path: reads.append(path) or original(self, path))
    reader = JournalReader(tmp_path, -1)
    for record in records:
        _same(reader.next(), record)
    assert len(reads) == 1  # (not one read of the segment's tail per record)
    assert reader.next() is None and len(reads) == 2
    writer = JournalWriter(tmp_path)
    writer.append(_record(10))  # appended later: read from where the reader stopped
    writer.close()
    _same(reader.next(), _record(10))
    assert reader.expected == 11 and journal.SEGMENT_RECORDS > 11


def test_stages_charge_cpu_time_to_the_stage_that_ends():
    stages = Stages()
    sum(i * i for i in range(200_000))
    stages.lap("analysis")
    stages.lap("answers")
    stages.counts["records"] += 1
    found = stages.to_json()
    assert found["cpu_s"]["analysis"] > 0 and found["cpu_s"]["analysis"] > found["cpu_s"]["answers"]
    assert found["counts"] == {"records": 1}


def test_a_background_run_hands_back_the_workers_account(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    steps = WAKE_RECORDS * 2 + 3
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        sink = profiler._sink
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.record_stats()
    stats = sink.worker_stats
    assert stats is not None, "the worker sends its account before it exits"
    assert stats["counts"]["records"] == steps and stats["counts"]["detailed"] == 10  # the default policy's first
    assert 1 <= stats["counts"]["gathers"] <= steps
    assert stats["cpu_s"]["start"] > 0 and stats["cpu_s"]["analysis"] > 0
    assert {"journal read and decode", "answers", "flush: iterations part"} <= set(stats["cpu_s"])


_PRIORITY_PROBE = """
import os, sys
from memprof.trace.pipeline.worker import lower_priority
before = os.nice(0)
done = lower_priority(sys.argv[1] or None)
idle = getattr(os, "SCHED_IDLE", None)
print(done, idle is not None and os.sched_getscheduler(0) == idle, os.nice(0) - before)
"""


@pytest.mark.parametrize("wanted,expected", [("idle", ("idle", "True", "0")), ("nice:5", ("nice:5", "False", "5")),
                                             ("", ("idle", "True", "0")), ("nonsense", ("idle", "True", "0"))])
def test_the_worker_lowers_its_priority_as_asked(wanted, expected):
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE here")
    found = subprocess.run([sys.executable, "-c", _PRIORITY_PROBE, wanted], capture_output=True, text=True,
                           check=True, env={**os.environ, "MEMPROF_WORKER_PRIORITY": ""})  # (a lowered priority stays)
    assert tuple(found.stdout.split()) == expected


def test_the_worker_runs_idle_in_the_training_session_in_a_group_of_its_own(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with MemoryProfiler(model, out_dir=tmp_path, print_period=0) as profiler:
        model(torch.randn(4, 8)).sum().backward()
        profiler.record_stats()
        pid = profiler._sink.pid
        # the scheduler groups tasks by session: in training's session, its low priority counts against training
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpgid(pid) != os.getpgid(0)  # a terminal's Ctrl-C goes to the foreground group only
        deadline = time.monotonic() + 30
        while os.sched_getscheduler(pid) != getattr(os, "SCHED_IDLE", -1) and time.monotonic() < deadline:
            time.sleep(0.05)  # it lowers its priority as it starts
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE


def test_the_worker_is_woken_once_per_gather(tmp_path, monkeypatch):
    woken: list[int] = []
    original = BackgroundSink._wake
    monkeypatch.setattr(BackgroundSink, "_wake", lambda self, through: woken.append(through) or original(self, through))
    monkeypatch.setenv(PRIORITY_ENV, "nice:0")  # (this machine may be busy: the test is of the wake-ups, not priority)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    steps = WAKE_RECORDS * 3 + 2
    with MemoryProfiler(model, out_dir=tmp_path, print_period=0) as profiler:
        sink = profiler._sink
        for step in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            profiler.record_stats()
            if step == 0:
                while sink._answered < 1:  # past the worker's start (which a step this small would wait for)
                    sink._read(block=True)
                woken.clear()
            time.sleep(0.03)  # steps slower than the worker's records: it is never far behind
        assert woken == [WAKE_RECORDS * k for k in range(1, 4)]  # (every 8th after the one it was woken for)
        deadline = time.monotonic() + 10  # training pauses: the worker processes the records it was not woken for
        while sink._answered < steps and time.monotonic() < deadline:
            sink._read(block=False)
            time.sleep(0.05)
        assert sink._answered == steps and woken == [WAKE_RECORDS * k for k in range(1, 4)]
    assert load_trace(profiler.run_dir).iterations.iteration.tolist() == list(range(steps))


def test_a_report_due_wakes_the_worker_at_once(tmp_path, monkeypatch):
    woken: list[int] = []
    original = BackgroundSink._wake
    monkeypatch.setattr(BackgroundSink, "_wake", lambda self, through: woken.append(through) or original(self, through))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with MemoryProfiler(model, out_dir=tmp_path, print_period=3, stream=io.StringIO()) as profiler:
        for _ in range(7):
            model(torch.randn(4, 8)).sum().backward()
            profiler.record_stats()
    assert woken == [0, 3, 6]
