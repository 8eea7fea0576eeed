"""The background worker's economy: a journal read once when behind, records in gathers, its CPU accounted for."""

from __future__ import annotations

import torch
from torch import nn

from memprof import MemoryProfiler
from memprof.trace.pipeline import journal
from memprof.trace.pipeline.journal import JournalReader, JournalWriter
from memprof.trace.pipeline.worker import GATHER_RECORDS, Stages
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
    steps = GATHER_RECORDS * 2 + 3
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
