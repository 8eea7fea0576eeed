"""The search for the largest batch that fits, against the slow, obvious scan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.measure.batch_fit import Planned, largest_fitting, largest_fitting_reference


@given(threshold=st.integers(0, 5000), start=st.integers(1, 300), limit=st.integers(1, 6000))
def test_the_search_agrees_with_the_scan(threshold: int, start: int, limit: int) -> None:
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= threshold

    found = largest_fitting(fits, start, limit)
    assert found == largest_fitting_reference(lambda n: n <= threshold, start, limit)
    assert all(start <= n <= limit for n in asked)
    if found is not None:
        assert len(asked) <= 2 * math.log2(found) + 3  # doubling, then bisection; never a scan


def test_a_schedule_costs_its_extra_time_over_the_step() -> None:
    assert Planned("rotor", 10, extra_ms=2.2, step_ms=10.0).slowdown == pytest.approx(0.22)
    assert Planned("rotor", 10, extra_ms=1.0, step_ms=0.0).slowdown == 0.0
