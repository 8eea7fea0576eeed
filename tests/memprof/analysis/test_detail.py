"""The detail policy: which iterations keep their layers and events rows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memprof.analysis.detail import DetailPolicy
from memprof.errors import ProfilerError


def test_scheduled_iterations_are_the_first_ones_and_every_nth():
    policy = DetailPolicy(first=3, every=10, peak_rise=0.01)
    assert [i for i in range(35) if policy.scheduled(i)] == [0, 1, 2, 10, 20, 30]
    assert [i for i in range(5) if DetailPolicy(first=0, every=0).scheduled(i)] == []
    assert all(DetailPolicy.everything().scheduled(i) for i in range(50))


def test_a_new_peak_must_rise_above_the_highest_detailed_one():
    policy = DetailPolicy(peak_rise=0.01)
    assert policy.new_peak(1, 0)  # nothing detailed yet: any peak is new
    assert not policy.new_peak(1_010_000, 1_000_000)  # exactly 1% higher is not more than 1%
    assert policy.new_peak(1_010_001, 1_000_000)
    assert DetailPolicy(peak_rise=0.0).new_peak(1_000_001, 1_000_000)


@given(peaks=st.lists(st.integers(1, 10**9), min_size=1, max_size=200), rise=st.sampled_from([0.0, 0.01, 0.5]))
def test_the_highest_peak_is_within_the_rise_of_a_detailed_one(peaks, rise):
    # Replays the processor's rule (it raises the detailed peak whenever an iteration keeps its detail).
    policy, detailed_peak, kept = DetailPolicy(first=0, every=0, peak_rise=rise), 0, []
    for iteration, peak in enumerate(peaks):
        if policy.new_peak(peak, detailed_peak):
            kept.append(iteration)
            detailed_peak = max(detailed_peak, peak)
    assert max(peaks) <= max(peaks[i] for i in kept) * (1 + rise)
    if rise == 0.0:
        assert peaks.index(max(peaks)) in kept  # the first iteration to reach the highest peak


@pytest.mark.parametrize("kwargs, word", [
    ({"first": -1}, "detail_first"), ({"every": 1.5}, "detail_every"), ({"every": True}, "detail_every"),
    ({"peak_rise": -0.1}, "detail_peak_rise"), ({"peak_rise": float("nan")}, "detail_peak_rise"),
    ({"peak_rise": "1%"}, "detail_peak_rise"),
])
def test_bad_settings_are_refused_with_the_argument_named(kwargs, word):
    with pytest.raises(ProfilerError, match=word):
        DetailPolicy(**kwargs)


def test_json_round_trip():
    policy = DetailPolicy(first=4, every=50, peak_rise=0.05)
    assert DetailPolicy.from_json(policy.to_json()) == policy
