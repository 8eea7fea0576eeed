"""The background worker's vectorised figures against their slow, obvious references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memprof.analysis.attribution import FEATURE, N_CAT, Call, Sweep
from memprof.analysis.layers import call_costs, call_costs_reference
from memprof.analysis.timeline import _peaks_between, peaks_between_reference


@st.composite
def series_and_rows(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    total = np.array(draw(st.lists(st.integers(0, 1 << 40), min_size=1, max_size=60)), dtype=np.int64)
    idx = draw(st.lists(st.integers(0, len(total) - 1), min_size=0, max_size=40))
    return total, np.array(sorted(idx) if draw(st.booleans()) else idx, dtype=np.int64)


@given(series_and_rows())
@settings(max_examples=300, deadline=None)
def test_peaks_between_matches_the_reference(case: tuple[np.ndarray, np.ndarray]) -> None:
    total, idx = case
    assert _peaks_between(total, idx).tolist() == peaks_between_reference(total, idx).tolist()


@st.composite
def sweeps_and_calls(draw: st.DrawFn) -> tuple[Sweep, np.ndarray, list[Call]]:
    changes = draw(st.integers(0, 40))
    blocks = draw(st.integers(0, 30))
    sw = Sweep()
    for _ in range(blocks):
        alloc = draw(st.integers(-1, max(changes - 1, -1)))
        free = draw(st.one_of(st.just(-1), st.integers(max(alloc, 0), max(changes, 0))))
        sw.alloc_change.append(alloc)
        sw.free_change.append(free)
        sw.sizes.append(draw(st.integers(1, 1 << 30)))
        sw.categories.append(draw(st.one_of(st.just(FEATURE), st.integers(0, N_CAT - 1))))
    activations = np.array(draw(st.lists(st.integers(-(1 << 40), 1 << 40), min_size=changes + 1,
                                         max_size=changes + 1)), dtype=np.int64)
    calls = []
    for _ in range(draw(st.integers(0, 12))):
        start = draw(st.integers(0, changes))
        calls.append(Call(module=0, start_change=start, start_ns=0, end_change=draw(st.integers(start, changes))))
    return sw, activations, calls


@given(sweeps_and_calls())
@settings(max_examples=300, deadline=None)
def test_call_costs_match_the_reference(case: tuple[Sweep, np.ndarray, list[Call]]) -> None:
    sw, activations, calls = case
    assert call_costs(sw, activations, calls) == call_costs_reference(sw, activations, calls)
