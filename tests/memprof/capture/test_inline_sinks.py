"""The journaled sink (memprof.capture.inline_sinks.JournaledSink): records journaled at once, analysed in gathers,
written in batches; the same rows as the per-iteration inline sink, and a journal the reader can finish."""

from __future__ import annotations

import shutil

import torch

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.analysis.iteration import IterationProcessor
from memprof.capture import inline_sinks
from memprof.capture.inline_sinks import GATHER_RECORDS, InlineSink, JournaledSink
from memprof.trace.format.writer import TraceWriter
from memprof.trace.pipeline.journal import JOURNAL_DIR, JournalWriter, read_state, segment_starts, write_state
from memprof.trace.reader import table_parts
from tests.memprof.analysis.test_sweep import processed_records

STEPS = 21


def _records(tmp_path, monkeypatch) -> tuple[list, object, object]:
    """A short run's records (a transformer, steady iterations among them), its first state and its spec; its
    ``meta.json`` is in ``tmp_path / "meta.json"``."""
    seen = processed_records(monkeypatch)
    torch.manual_seed(0)
    model, make_batch = zoo.transformer(dim=32, heads=4, layers=2, seq=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path / "recorded", print_period=0, background=False) as p:
        for _ in range(STEPS):
            zoo.train_step(model, optimizer, batch)
            p.record_stats()
    shutil.copy(p.run_dir / "meta.json", tmp_path / "meta.json")
    monkeypatch.undo()
    return [r for r, _, _ in seen], seen[0][1], seen[0][2]


def _journaled(run_dir, state, spec) -> JournaledSink:
    journal_dir = run_dir / JOURNAL_DIR
    journal_dir.mkdir(parents=True)
    shutil.copy(run_dir.parent / "meta.json", run_dir / "meta.json")
    write_state(journal_dir, state)
    return JournaledSink(IterationProcessor(spec, state), TraceWriter(run_dir), JournalWriter(journal_dir),
                         journal_dir)


def test_records_are_analysed_in_gathers_and_written_as_the_inline_sink_writes_them(tmp_path, monkeypatch):
    records, state, spec = _records(tmp_path, monkeypatch)
    monkeypatch.setattr(inline_sinks, "FLUSH_ITERATIONS", 16)
    sink = _journaled(tmp_path / "journaled", state, spec)
    answered = []
    for k, record in enumerate(records):
        outcomes = sink.submit(record)
        # nothing is analysed until a gather is complete; then the whole gather, in order
        assert [o.iteration for o in outcomes] == ([] if (k + 1) % GATHER_RECORDS else
                                                  list(range(k + 1 - GATHER_RECORDS, k + 1)))
        answered += outcomes
        assert (tmp_path / "journaled" / JOURNAL_DIR).is_dir()
    # 16 analysed: one batch written, its state saved; the segment holding iterations not yet written stays
    assert read_state(tmp_path / "journaled" / JOURNAL_DIR).last_iteration == 15
    assert len(table_parts(tmp_path / "journaled", "iterations")) == 1
    assert segment_starts(tmp_path / "journaled" / JOURNAL_DIR) == [0]
    answered += sink.finish()
    assert [o.iteration for o in answered] == list(range(STEPS)) and not any(o.write_error for o in answered)
    (tmp_path / "inline").mkdir()
    shutil.copy(tmp_path / "meta.json", tmp_path / "inline" / "meta.json")
    inline = InlineSink(IterationProcessor(spec, state), TraceWriter(tmp_path / "inline"))
    for record in records:
        inline.submit(record)
    ours, theirs = (load_trace(tmp_path / name) for name in ("journaled", "inline"))
    columns = [c for c in theirs.iterations.columns if c != "step_ms"]
    assert ours.iterations[columns].equals(theirs.iterations[columns])
    assert ours.layers.equals(theirs.layers) and ours.events.equals(theirs.events)


def test_a_report_due_is_answered_at_once(tmp_path, monkeypatch):
    records, state, spec = _records(tmp_path, monkeypatch)
    spec = type(spec).from_json({**spec.to_json(), "print_period": 3})
    sink = _journaled(tmp_path / "journaled", state, spec)
    outcomes = [sink.submit(record) for record in records[:4]]
    assert [[o.iteration for o in batch] for batch in outcomes] == [[0], [], [], [1, 2, 3]]
    assert outcomes[3][-1].report is not None and "iteration 3" in outcomes[3][-1].report
    assert [o.iteration for o in sink.finish()] == []


def test_a_journal_that_cannot_be_written_falls_back_to_writing_every_iteration(tmp_path, monkeypatch):
    records, state, spec = _records(tmp_path, monkeypatch)
    sink = _journaled(tmp_path / "journaled", state, spec)
    for record in records[:3]:
        assert sink.submit(record) == []

    def refuse(record: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(sink.journal, "append", refuse)
    outcomes = sink.submit(records[3])
    assert [o.iteration for o in outcomes] == [0, 1, 2, 2, 3]  # the three waiting, the refusal, then itself
    assert outcomes[3].write_error == "No space left on device" and sink.journal is None
    outcomes = sink.submit(records[4])  # no journal: analysed and written at once
    assert [o.iteration for o in outcomes] == [4] and len(table_parts(tmp_path / "journaled", "iterations")) == 3
    sink.finish()
    assert load_trace(tmp_path / "journaled").iterations.iteration.tolist() == [0, 1, 2, 3, 4]
