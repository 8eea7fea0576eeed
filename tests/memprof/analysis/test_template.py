"""Templates (memprof.analysis.template): a steady iteration's marks placed among its own events are the marks
its hooks would have made; an iteration that does not repeat the template is told apart, never misread."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.records import AllocationEvents, IterationRecord, Mark, MarkTemplate
from memprof.analysis.template import (
    TEMPLATED,
    apply_template,
    pairing,
    pairing_reference,
    same_allocations,
    synthesized,
    take_template,
)
from memprof.capture.sinks import InlineSink


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(1 << 40), 1 << 40).filter(bool), max_size=30), st.data())
def test_same_allocations_is_an_element_by_element_comparison(sizes, data):
    """The training process's check (one comparison of raw bytes) against its definition: the same sizes in the
    same order, whatever the other side's length, order or integer type."""
    template = MarkTemplate(iteration=0, sizes=np.asarray(sizes, dtype=np.int64), pairing=np.zeros(0, np.int64),
                            marks=np.zeros((0, 4), np.int64), storages=np.zeros((0, 3), np.int64),
                            observations=np.zeros((0, 4), np.int64), param_grads=np.zeros((0, 4), np.int64))
    other = data.draw(st.one_of(st.just(list(sizes)), st.permutations(sizes),
                                st.lists(st.integers(-(1 << 40), 1 << 40), max_size=30)))
    dtype = data.draw(st.sampled_from([np.int64, np.float64] if all(abs(v) < 1 << 52 for v in other) else [np.int64]))
    zeros = np.zeros(len(other), dtype=np.int64)
    events = AllocationEvents(zeros, zeros, np.asarray(other, dtype=dtype), zeros, zeros)
    assert same_allocations(template, events) == (list(other) == list(sizes))


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3).filter(bool)), max_size=60))
def test_pairing_is_the_walks(events):
    """Lost frees (an address allocated twice), frees of unknown addresses, reuse of an address."""
    ptrs = np.asarray([p for p, _ in events], dtype=np.int64)
    sizes = np.asarray([s for _, s in events], dtype=np.int64)
    assert pairing(ptrs, sizes).tolist() == pairing_reference(ptrs, sizes).tolist()


@pytest.fixture(scope="module")
def records() -> list[IterationRecord]:
    """Four hooked iterations of a transformer, as the training process recorded them."""
    seen: list[IterationRecord] = []
    submit = InlineSink.submit

    def spy(self, record):  # noqa: ANN001, ANN202
        seen.append(record)
        return submit(self, record)

    InlineSink.submit = spy  # type: ignore[method-assign]
    try:
        torch.manual_seed(0)
        model, make_batch = zoo.transformer(dim=32, heads=4, layers=2, seq=16)
        optimizer = torch.optim.Adam(model.parameters())
        import tempfile
        with MemoryProfiler(model, optimizer, out_dir=tempfile.mkdtemp(), print_period=0, background=False,
                            steady=False) as profiler:
            for _ in range(4):
                batch = make_batch(4)
                profiler.mark_inputs(batch)
                zoo.train_step(model, optimizer, batch)
                profiler.record_stats()
    finally:
        InlineSink.submit = submit  # type: ignore[method-assign]
    return seen


def _steady(record: IterationRecord, template) -> IterationRecord:  # noqa: ANN001
    """The record as a steady iteration makes it: the hooks that stay on only, and the template."""
    return replace(record, marks=[m for m in record.marks if not synthesized(m[2])],
                   observations=[o for o in record.observations if o[2] not in TEMPLATED], param_grads={},
                   template=template)


def _bounds(record: IterationRecord, marks: list) -> list[int]:
    return np.searchsorted(record.events.time_ns, [m[0] for m in marks], side="right").tolist()


def test_the_placed_marks_are_the_hooks_own(records):
    template = take_template(records[2])
    assert template is not None and np.array_equal(template.sizes, records[3].events.size_bytes)
    found = apply_template(template, _steady(records[3], template))
    assert found is not None
    placed, truth = found.marks, records[3].marks
    assert len(placed) == len(truth) > 50
    assert [(int(k), m, [tuple(s) for s in p]) for _, k, m, p in placed] == \
        [(int(k), m, [tuple(s) for s in p]) for _, k, m, p in truth]
    assert _bounds(records[3], placed) == _bounds(records[3], truth)  # among the same events
    assert [t for t, *_ in placed] == sorted(t for t, *_ in placed)
    # the model's own marks keep their moments
    assert [m[0] for m in placed if not synthesized(m[2])] == [m[0] for m in truth if not synthesized(m[2])]
    # the gradients' and the optimizer's observations, each among the same events, and the parameters' gradients
    observed = records[3].observations
    assert sum(o[2] in TEMPLATED for o in observed) > 50
    assert sorted((o[1], o[2]) for o in found.observations) == sorted((o[1], o[2]) for o in observed)
    key = sorted(range(len(observed)), key=lambda i: (observed[i][1], observed[i][2]))
    again = sorted(range(len(found.observations)), key=lambda i: found.observations[i][1:3])
    assert _bounds(records[3], [found.observations[i] for i in again]) == _bounds(records[3], [observed[i] for i in key])
    assert found.param_grads == records[3].param_grads and len(found.param_grads) > 10


def test_an_iteration_that_does_not_repeat_the_template_is_told_apart(records):
    template = take_template(records[2])
    assert template is not None
    steady = _steady(records[3], template)
    ev = steady.events
    grown = ev.size_bytes.copy()
    grown[5] += 8 if grown[5] > 0 else -8
    assert apply_template(template, replace(steady, events=replace(ev, size_bytes=grown))) is None
    # the same sizes, but a free that frees another block of that size than the template's did
    sizes, ptrs, pair = ev.size_bytes, ev.ptr.copy(), template.pairing
    made = np.nonzero(sizes > 0)[0]
    twins = [(a, b) for i, a in enumerate(made) for b in made[i + 1:] if sizes[a] == sizes[b]
             and len(pair) > _freed(pair, pair[a]) > b and _freed(pair, pair[b]) > b]
    assert twins, "the transformer allocates blocks of equal sizes alive together"
    a, b = twins[0]
    ptrs[[a, b]] = ptrs[[b, a]]
    assert apply_template(template, replace(steady, events=replace(ev, ptr=ptrs))) is None
    # own marks that are not the template's: a forward more, or one missing
    extra = [*steady.marks, (int(ev.time_ns[-1]) + 1, Mark.FWD_ENTER, 0, [])]
    assert apply_template(template, replace(steady, marks=extra)) is None
    assert apply_template(template, replace(steady, marks=steady.marks[1:])) is None
    # a clock that goes back cannot be placed
    back = [(t if i != 3 else 0, k, m, p) for i, (t, k, m, p) in enumerate(records[2].marks)]
    assert take_template(replace(records[2], marks=back)) is None


def _freed(pair: np.ndarray, position: int) -> int:
    """The event that frees the block made at ``position`` (len when none does)."""
    frees = np.nonzero(pair == position)[0]
    return int(frees[1]) if len(frees) > 1 else len(pair)


def test_a_failed_iteration_is_placed_as_far_as_it_ran(records):
    template = take_template(records[2])
    assert template is not None
    full = records[3]
    cut = len(full.events) // 2
    cut_ns = int(full.events.time_ns[cut - 1])
    events = AllocationEvents(*(np.asarray(c)[:cut] for c in (full.events.time_ns, full.events.ptr,
                                                                full.events.size_bytes,
                                                                full.events.total_allocated_bytes,
                                                                full.events.total_reserved_bytes)))
    ran = [m for m in full.marks if m[0] <= cut_ns]
    failed = replace(_steady(replace(full, marks=ran, events=events), template), failed=True)
    placed = apply_template(template, failed)
    assert placed is not None
    assert [(int(k), m) for _, k, m, _ in placed.marks] == [(int(k), m) for _, k, m, _ in ran]
    assert all(o[0] <= cut_ns for o in placed.observations)
    assert apply_template(template, replace(failed, failed=False)) is None  # only a failed one may stop short
