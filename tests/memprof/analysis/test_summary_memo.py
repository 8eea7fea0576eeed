"""The memo of steady summaries (memprof.analysis.summary_memo) against the summary worked out afresh, record by
record: the same answer, whether it reused the previous attribution or not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.marks_walk import MarksCache
from memprof.analysis.records import LiveBlock
from memprof.analysis.summary_memo import SummaryMemo
from memprof.analysis.template_summary import template_summary
from tests.memprof.analysis.test_summary import _summary_facts
from tests.memprof.analysis.test_sweep import processed_records


def _steady_records(tmp_path, monkeypatch, steps: int = 24) -> list:
    seen = processed_records(monkeypatch)
    torch.manual_seed(0)
    model, make_batch = zoo.transformer(dim=32, heads=4, layers=2, seq=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(steps):
            zoo.train_step(model, optimizer, make_batch(4))
            profiler.record_stats()
    return [(r, s, spec.parents) for r, s, spec in seen if r.template is not None]


def test_consecutive_steady_records_reuse_the_attribution_and_answer_as_afresh(tmp_path, monkeypatch) -> None:
    steady = _steady_records(tmp_path, monkeypatch)
    assert len(steady) >= 8
    memo = SummaryMemo()
    for record, state, parents in steady:
        args = (state.blocks, state.next_block_id, state.order)
        afresh = template_summary(record, *args, MarksCache(parents))
        remembered = template_summary(record, *args, MarksCache(parents), memo=memo)
        assert afresh is not None and remembered is not None
        assert _summary_facts(remembered) == _summary_facts(afresh)
    # each record's own cache of marks: the facts are an equal object, not the same one, so ...
    assert memo.hits == 0
    cache, memo = MarksCache(steady[0][2]), SummaryMemo()
    for record, state, _ in steady:  # ... with the run's one cache, as the processor has it, they repeat
        args = (state.blocks, state.next_block_id, state.order)
        remembered = template_summary(record, *args, cache, memo=memo)
        assert remembered is not None
        assert _summary_facts(remembered) == _summary_facts(template_summary(record, *args, MarksCache(steady[0][2])))
    assert memo.hits >= len(steady) - 2 and memo.misses >= 1


def test_what_the_attribution_reads_differing_is_attributed_afresh(tmp_path, monkeypatch) -> None:
    steady = _steady_records(tmp_path, monkeypatch, steps=16)
    (first, state0, parents), (second, state1, _) = steady[-2], steady[-1]
    cache, memo = MarksCache(parents), SummaryMemo()
    template_summary(first, state0.blocks, state0.next_block_id, state0.order, cache, memo=memo)
    # the carried blocks of the second record in another category: not the previous attribution's input
    recategorised = [LiveBlock(b.block_id, b.ptr, b.size_bytes, (b.category + 1) % 3) for b in state1.blocks]
    args = (recategorised, state1.next_block_id, state1.order)
    found = template_summary(second, *args, cache, memo=memo)
    afresh = template_summary(second, *args, MarksCache(parents))
    assert (memo.hits, memo.misses) == (0, 2)
    assert found is not None and afresh is not None and _summary_facts(found) == _summary_facts(afresh)
    assert not np.array_equal(found.at_peak, template_summary(second, state1.blocks, state1.next_block_id, state1.order,
                                                              MarksCache(parents)).at_peak)
    # and a record that does not repeat its template is still told apart, memo or not
    grown = second.events.size_bytes.copy()
    grown[3] += 8 if grown[3] > 0 else -8
    changed = replace(second, events=replace(second.events, size_bytes=grown))
    assert template_summary(changed, state1.blocks, state1.next_block_id, state1.order, cache, memo=memo) is None
