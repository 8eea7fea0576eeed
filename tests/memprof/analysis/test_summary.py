"""The summary of an iteration that keeps no detail (memprof.analysis.summary) against the reference walk."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.attribution import INPUTS, OTHER, Sweep, sweep_reference
from memprof.analysis.iteration import IterationProcessor, _hooks
from memprof.analysis.marks_walk import MarksCache
from memprof.analysis.micro_batches import micro_batches
from memprof.analysis.records import LiveBlock, Mark
from memprof.analysis.summary import Summary, summary_sweep
from memprof.analysis.template_summary import template_summary
from memprof.analysis.timeline import peak_figures
from tests.memprof.analysis.test_sweep import (
    ADDRESSES,
    PARENTS,
    _events,
    iterations,
    processed_records,
    profile_zoo,
)
from tests.memprof.capture.test_steady import MODELS as STEADY_MODELS
from tests.memprof.capture.test_steady import _train


def _facts(sw: Sweep) -> dict:
    """The reference's answers to what a summary says."""
    total, at_peak = peak_figures(sw)
    k = int(np.argmax(total))
    live = [LiveBlock(sw.block_ids[i], ptr, sw.sizes[i], sw.categories[i]) for ptr, i in sw.live.items()]
    return {"total": total.tolist(), "at_peak": at_peak.tolist(),
            "peak_phase": int(sw.change_phase[k - 1]) if k else 0, "peak_module": int(sw.change_module[k - 1]) if k else -1,
            "num_allocations": sum(1 for a in sw.alloc_change if a >= 0), "micro_batches": micro_batches(sw.marks).count,
            "live": live, "next_block_id": sw.next_block_id}


def _summary_facts(found: Summary) -> dict:
    return {"total": found.total.tolist(), "at_peak": found.at_peak.tolist(), "peak_phase": found.peak_phase,
            "peak_module": found.peak_module, "num_allocations": found.num_allocations,
            "micro_batches": found.micro_batches, "live": list(found.live), "next_block_id": found.next_block_id}


def _check(events, marks, observations, frees, carried, parents, next_id, cache=None) -> bool:  # noqa: ANN001
    """Whether the summary answered; where it did, its answers are the reference's."""
    sw = sweep_reference(events, marks, observations, frees, carried, parents, next_id, use_truth=False)
    order = {m: m for m in range(len(parents))}
    found = summary_sweep(events, marks, observations, frees, carried, next_id, order, cache or MarksCache(parents))
    if found is None:
        return False
    assert _summary_facts(found) == _facts(sw)
    return True


@st.composite
def clean_iterations(draw: st.DrawFn) -> tuple:
    """:func:`iterations` without what sends the summary to the sweep: every address allocated at most once
    while alive (by the allocator, and as it knows: a free of an older storage may free a block first), no bucket
    rebuilds, no inputs made before profiling, nothing seen as ``other``."""
    rows, marks, observations, frees, carried, next_id = draw(iterations())
    alive = {b.ptr for b in carried}
    clean = []
    for t, ptr, size, total in sorted(rows, key=lambda r: r[0]):
        if size > 0 and ptr not in alive:
            alive.add(ptr)
            clean.append((t, ptr, size, total))
        elif size < 0 and ptr in alive:
            alive.discard(ptr)
            clean.append((t, ptr, size, total))
    marks = [(t, k, mod, [] if (k == Mark.FWD_ENTER and mod == 0) else p) for t, k, mod, p in marks
             if k != Mark.BUCKETS_REBUILT]
    observations = [o for o in observations if o[2] != OTHER and not (o[2] == INPUTS and o[3] > 0)]
    return clean, marks, observations, frees, carried, next_id


@given(iterations())
@settings(max_examples=300, deadline=None)
def test_the_summary_is_the_reference_or_declines(case: tuple) -> None:
    rows, marks, observations, frees, carried, next_id = case
    _check(_events(rows), marks, observations, frees, carried, PARENTS, next_id)


@given(clean_iterations())
@settings(max_examples=300, deadline=None)
def test_the_summary_answers_clean_iterations_as_the_reference(case: tuple) -> None:
    rows, marks, observations, frees, carried, next_id = case
    assert _check(_events(rows), marks, observations, frees, carried, PARENTS, next_id)


def test_a_cached_walk_of_the_marks_answers_a_repeat() -> None:
    cache = MarksCache(PARENTS)
    rows = [(1, ADDRESSES[0], 64, 0), (3, ADDRESSES[1], 32, 0), (5, ADDRESSES[0], -64, 0)]
    marks = [(0, 0, 0, []), (2, 0, 1, []), (4, 1, 1, [(ADDRESSES[1], 32)]), (4, 1, 0, [(ADDRESSES[1], 32)]),
             (6, 4, -1, [])]
    for _ in range(2):
        assert _check(_events(rows), marks, [], [], [], PARENTS, 1, cache)
    assert len(cache._found) == 1


def test_recorded_iterations_of_the_zoo_models_summarise_as_they_sweep(tmp_path, monkeypatch):
    """Real records, steady ones included: each iteration of a few profiled steps, with its carried state."""
    seen = processed_records(monkeypatch)
    profile_zoo(tmp_path, steps=14)  # (the first 10 keep their detail, hooked; steady ones follow)
    answered = steady = 0
    for record, state, spec in seen:
        hooks, _ = _hooks(record)  # a steady iteration's marks are its template's, placed
        steady += record.template is not None
        answered += _check(record.events, hooks.marks, hooks.observations, record.frees, state.blocks,
                           spec.parents, state.next_block_id)
    assert steady >= 12
    assert answered >= len(seen) - 3  # (the first iteration of each: its inputs were made before profiling)


def test_a_steady_record_summarises_from_its_template_as_from_its_placed_marks(tmp_path, monkeypatch):
    """The template's own arrays (memprof.analysis.template_summary) against the placed marks' summary, and so
    against the reference walk; a record that does not repeat its template is left to the usual analysis."""
    seen = processed_records(monkeypatch)
    torch.manual_seed(0)
    model, make_batch = zoo.transformer(dim=32, heads=4, layers=2, seq=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(16):
            batch = make_batch(4)  # a new batch each step: the model's inputs are the iteration's own blocks
            profiler.mark_inputs(batch)
            zoo.train_step(model, optimizer, batch)
            profiler.record_stats()
    steady = [(r, s, spec.parents) for r, s, spec in seen if r.template is not None]
    assert len(steady) >= 4
    for record, state, parents in steady:
        hooks, _ = _hooks(record)
        args = (state.blocks, state.next_block_id, state.order)
        placed = summary_sweep(record.events, hooks.marks, hooks.observations, record.frees, *args, MarksCache(parents))
        direct = template_summary(record, *args, MarksCache(parents))
        assert placed is not None and direct is not None
        assert _summary_facts(direct) == _summary_facts(placed)
        sw = sweep_reference(record.events, hooks.marks, hooks.observations, record.frees, state.blocks, parents,
                             state.next_block_id, use_truth=False)
        assert _summary_facts(direct) == _facts(sw)
        ev = record.events
        grown = ev.size_bytes.copy()
        grown[3] += 8 if grown[3] > 0 else -8
        assert template_summary(replace(record, events=replace(ev, size_bytes=grown)), *args,
                                MarksCache(parents)) is None
        assert template_summary(replace(record, marks=record.marks[1:]), *args, MarksCache(parents)) is None


@pytest.mark.parametrize(("name", "steady"), [("cnn", True), ("lstm", True), ("llama", False), ("hf-bert", True),
                                              ("hf-gpt2-autocast-accumulating", True)])
def test_records_summarised_give_the_rows_records_swept_give(name, steady, tmp_path, monkeypatch):
    """Whole runs' records, of models written by others among them (marked inputs, whose old storages die;
    accumulation under autocast), analysed again from the run's first state: with the summary, and with every
    iteration swept. Every row of every table, and the state each hands on, are the same."""
    seen = processed_records(monkeypatch)
    _train(STEADY_MODELS[name], tmp_path, steady=steady, background=False)
    monkeypatch.undo()
    records, first, spec = [r for r, _, _ in seen], seen[0][1], seen[0][2]
    summarised = IterationProcessor(spec, first)
    swept = IterationProcessor(spec, first)
    swept._summarised = lambda state, record: None  # type: ignore[method-assign]
    answered = 0
    for record in records:
        answered += summarised._summarised(summarised.state, record) is not None
        a, b = summarised.process(record), swept.process(record)
        assert a.row == b.row and a.layers == b.layers and a.detail == b.detail
        assert a.events.equals(b.events) and list(summarised.state.blocks) == list(swept.state.blocks)
        assert summarised.state.next_block_id == swept.state.next_block_id
    assert answered >= 3 and any(r.template is not None for r in records) == steady
