"""The minimum feasible budget of a chain with a carried tensor is a memory fact: the stages' times do not move it.

The solvers plan the chain without its carried tensors, and at their own minimum several schedules fit; which is
fastest depends on the times, and their carried peaks differ. The minimum used to be the fastest one's carried
peak, so the same chain timed twice (a busy machine, a quiet one) got two minimums.
"""

from __future__ import annotations

import pytest

from planner import InfeasibleBudgetError, min_feasible_budget, solve
from planner.model.chain import Chain, Stage
from planner.solvers.carried_fit import Carried, peak_bytes
from planner.solvers.dispatch import solver

SLOTS = 100
# (a^l, a-bar^l) of six stages; stage 3's output is read again by stage 6 (a skip)
SIZES = ((300, 300), (300, 700), (300, 700), (200, 400), (300, 300), (200, 300))
TIMINGS = [(1.0,) * 6, *(tuple(10.0 if i == slow else 1.0 for i in range(6)) for slow in range(6))]


def _chain(forward_ms: tuple[float, ...]) -> Chain:
    stages = tuple(Stage(ms, 2.0, a, abar, a, name=f"s{i}") for i, ((a, abar), ms) in enumerate(zip(SIZES, forward_ms)))
    return Chain("skip", 100, (*stages, Stage(0.0, 0.0, 0, 0, 0)), carried=(Carried(3, (6,), 300, "s2"),))


def test_the_fastest_schedule_at_the_solvers_minimum_carries_more_or_less_by_the_times() -> None:
    """What the minimum was before: the fastest schedule's carried peak at rotor's own minimum (1,700 B of
    the chain alone), 2,000 B for most timings and 1,700 B when stage 3 is slow (the one then kept holds the
    skip's producer as a checkpoint)."""
    rotor = solver("rotor")
    peaks = {}
    for times in TIMINGS:
        chain = _chain(times)
        own = int(rotor.min_budget_bytes(chain, SLOTS))
        assert own == 1700
        peaks[times] = peak_bytes(chain, rotor.plan(chain, own, SLOTS).ops)
    assert set(peaks.values()) == {1700, 2000}


@pytest.mark.parametrize("algorithm", ["rotor", "selective", "rotor_optimal"])
@pytest.mark.parametrize("times", TIMINGS, ids=lambda t: "x".join(f"{v:g}" for v in t))
def test_the_minimum_is_the_same_for_every_timing_and_solved(algorithm: str, times: tuple[float, ...]) -> None:
    chain = _chain(times)
    minimum = min_feasible_budget(chain, algorithm, slots=SLOTS)
    assert minimum == 1700
    schedule = solve(chain, minimum, algorithm, slots=SLOTS)
    assert schedule.predicted_peak_bytes == peak_bytes(chain, schedule.ops) <= minimum
    for budget in (minimum + 1, minimum + 150, minimum + 300):  # every budget above it is solved too
        assert solve(chain, budget, algorithm, slots=SLOTS).predicted_peak_bytes <= budget
    with pytest.raises(InfeasibleBudgetError, match="1700"):
        solve(chain, minimum - 1, algorithm, slots=SLOTS)
