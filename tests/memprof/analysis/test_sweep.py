"""The analysis' sweep (memprof.analysis.sweep) against the slow, obvious reference walk, field for field."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.attribution import N_CAT, Sweep, sweep_reference
from memprof.analysis.iteration import IterationProcessor
from memprof.analysis.records import AllocationEvents, CarriedState, IterationRecord, LiveBlock, Mark, RunSpec
from memprof.analysis.sweep import sweep
from memprof.analysis.timeline import peak_figures, series

PARENTS = [-1, 0, 0, 1, 1, 2]  # a root, two children, three grandchildren
ADDRESSES = [0x1000 * k for k in range(1, 13)]


def _same(a: Sweep, b: Sweep) -> None:
    mine, theirs = asdict(a), asdict(b)
    for name in theirs:  # (a change's sign, phase, module and total: an array in one, a list in the other)
        if name.startswith("change_"):
            assert np.asarray(mine[name]).tolist() == np.asarray(theirs[name]).tolist(), name
        else:
            assert mine[name] == theirs[name], name


def _mark(draw: st.DrawFn, kind: int, module: int) -> tuple[int, int, list]:
    storage = st.tuples(st.sampled_from([*ADDRESSES, 0x99000]), st.integers(0, 4096))
    payload = draw(st.lists(storage, max_size=2))
    if kind == Mark.BUCKETS_REBUILT:
        payload.append((0, draw(st.integers(0, 8192))))
    return kind, -1 if kind in (Mark.BWD_END, Mark.OPT_ENTER, Mark.OPT_EXIT) else module, payload


@st.composite
def iterations(draw: st.DrawFn) -> tuple:
    """One iteration's records, with what the real ones have and worse: lost frees, frees of unknown addresses,
    equal times, events out of time order, inputs made before profiling, carried blocks, bucket rebuilds.

    The hooks' records follow a step's skeleton (the root's forward, backward, the optimizer) with random
    marks, observations and frees of pre-existing storages among them, and allocator events between them.
    """
    carried_ptrs = draw(st.lists(st.sampled_from(ADDRESSES), max_size=4, unique=True))
    carried = [LiveBlock(-k - 1, p, draw(st.integers(1, 4096)), draw(st.integers(0, N_CAT - 1)))
               for k, p in enumerate(carried_ptrs)]
    modules = st.sampled_from([0, 0, *range(len(PARENTS))])  # the root twice as often: its calls nest the others
    extra = st.tuples(st.sampled_from([int(k) for k in Mark]), modules)
    skeleton = [(Mark.FWD_ENTER, 0), *draw(st.lists(extra, max_size=8)), (Mark.FWD_EXIT, 0),
                *draw(st.lists(extra, max_size=8)), (Mark.BWD_END, -1), (Mark.OPT_ENTER, -1), (Mark.OPT_EXIT, -1)]
    marks, observations, frees, events = [], [], [], []
    t = 0
    for kind, module in skeleton:
        for _ in range(draw(st.integers(0, 5))):  # allocator events, an observation or a free of an old storage
            t += draw(st.integers(0, 1))
            what = draw(st.integers(0, 9))
            if what < 8:
                size = draw(st.integers(1, 4096)) * (1 if what < 5 else -1)
                events.append((t, draw(st.sampled_from(ADDRESSES)), size, draw(st.integers(0, 1 << 40))))
            elif what == 8:
                observations.append((t, draw(st.sampled_from([*ADDRESSES, 0x99000])), draw(st.integers(0, N_CAT - 1)),
                                     draw(st.integers(0, 4096))))
            else:
                frees.append((t, draw(st.sampled_from(ADDRESSES))))
        t += draw(st.integers(0, 1))
        marks.append((t, *_mark(draw, int(kind), module)))
    if draw(st.booleans()):  # a few events out of time order (threads append a little late)
        events = draw(st.permutations(events))
    return events, marks, observations, frees, carried, draw(st.integers(1, 100))


def _events(rows: list[tuple[int, int, int, int]]) -> AllocationEvents:
    if not rows:
        return AllocationEvents.empty()
    t, p, s, total = (np.array(c, dtype=np.int64) for c in zip(*rows))
    return AllocationEvents(t, p, s, total, np.zeros_like(t))


@given(iterations(), st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_sweep_matches_the_reference(case: tuple, use_truth: bool) -> None:
    rows, marks, observations, frees, carried, next_id = case
    args = (_events(rows), marks, observations, frees, carried, PARENTS, next_id)
    _same(sweep(*args, use_truth=use_truth), sweep_reference(*args, use_truth=use_truth))


@given(iterations())
@settings(max_examples=200, deadline=None)
def test_the_peak_figures_match_the_series(case: tuple) -> None:
    rows, marks, observations, frees, carried, next_id = case
    sw = sweep(_events(rows), marks, observations, frees, carried, PARENTS, next_id, use_truth=False)
    full = series(sw, use_truth=False)
    total, at_peak = peak_figures(sw)
    assert total.tolist() == full.total.tolist()
    assert at_peak.tolist() == full.per_category[int(np.argmax(full.total))].tolist()


def processed_records(monkeypatch: pytest.MonkeyPatch) -> list[tuple[IterationRecord, CarriedState, RunSpec]]:
    """What every :class:`IterationProcessor` is given from now on: each record, with the state before it and the
    run's spec (the processing itself unchanged)."""
    seen: list[tuple[IterationRecord, CarriedState, RunSpec]] = []
    original = IterationProcessor.process

    def spy(self: IterationProcessor, record: IterationRecord):  # noqa: ANN202 - a pass-through
        seen.append((record, self.state, self.spec))
        return original(self, record)

    monkeypatch.setattr(IterationProcessor, "process", spy)
    return seen


def profile_zoo(out_dir: Path, steps: int) -> None:
    """``steps`` inline-profiled training steps of the zoo's MLP, CNN and transformer, one batch each."""
    for build, batch in ((zoo.mlp, 16), (zoo.cnn, 4), (zoo.transformer, 2)):
        torch.manual_seed(0)
        model, make_batch = build()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        data = make_batch(batch)
        with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=False) as profiler:
            for _ in range(steps):
                zoo.train_step(model, optimizer, data)
                profiler.record_stats()


def test_recorded_iterations_of_the_zoo_models_sweep_alike(tmp_path, monkeypatch):
    """Real records: every iteration of a few profiled steps, with the state carried into it."""
    seen = processed_records(monkeypatch)
    profile_zoo(tmp_path, steps=3)
    assert len(seen) == 9
    for record, state, spec in seen:
        args = (record.events, record.marks, record.observations, record.frees, state.blocks, spec.parents,
                state.next_block_id)
        _same(sweep(*args, use_truth=False), sweep_reference(*args, use_truth=False))
