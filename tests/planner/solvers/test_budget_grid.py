"""Each budget on its own grid: the issue's 661-byte example, solve against exhaustive search, the minimum."""

from __future__ import annotations

import functools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import Chain, InfeasibleBudgetError, Stage, pareto_front, solve
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import simulate
from planner.solvers import exact, rotor, rotor_fill, rotor_optimal
from planner.solvers.budget_grid import (
    Minimum,
    exact_floor,
    lowest_budget,
    lowest_budget_reference,
    same_grid_budgets,
    solved_on_own_grid,
)
from planner.solvers.discretize import discretize, slot_bytes_for
from planner.solvers.dispatch import min_feasible_budget, store_all_budget
from tests.planner.chain_strategies import random_chain, small_chains

# Store-all peaks at 661 bytes. On store-all's grid (500 slots of 2 bytes, the old solve and today's
# slider) a 500-byte budget got 124.48 ms; on the budget's own grid (500 slots of 1 byte) 123.83 ms,
# the optimum over every valid sequence (exhaustive search, below). The tests hold these against
# their oracles (the exhaustive search; the DP on 1-byte slots) rather than against the numbers.
ISSUE_661 = Chain("issue-661", 183, (
    Stage(3.3, 25.43, 58, 60, 58, 8, 0),
    Stage(5.0, 18.39, 29, 49, 29, 17, 16),
    Stage(8.34, 10.26, 48, 65, 48, 7, 33),
    Stage(1.12, 10.84, 32, 59, 32, 18, 30),
    Stage(7.69, 2.0, 38, 62, 38, 2, 18),
    Stage(8.82, 5.53, 58, 60, 58, 10, 27),
    Stage(0.0, 0.0, 0, 0, 0),
))


def test_issue_661_budget_is_divided_into_its_own_slots() -> None:
    chain = ISSUE_661
    assert store_all_budget(chain) == 661
    old = pareto_front(chain).schedule_at(500)  # one table on store-all's grid
    schedule = solve(chain, 500, "rotor")
    assert old.params.slot_bytes == 2 and schedule.params == ScheduleParams(slots=500, slot_bytes=1)
    assert schedule.predicted_peak_bytes <= 500 and old.predicted_peak_bytes <= 500
    # The budget's own grid is 1-byte slots, on which the DP is exact (the hypothesis test below holds it
    # against exhaustive search): the same time as the DP on a 1-byte grid up to store-all's peak.
    exact_grid = rotor.compute_table(chain, grid=discretize(chain, 661, 661))
    optimum = simulate(chain, rotor.rebuild(exact_grid, 500)).makespan_ms
    assert schedule.predicted_makespan_ms == pytest.approx(optimum, abs=1e-9)
    assert solve(chain, 500, "rotor_optimal").predicted_makespan_ms == pytest.approx(optimum, abs=1e-9)
    assert old.predicted_makespan_ms > optimum + 0.5  # store-all's coarser grid gives away time (0.65 ms)


@pytest.mark.slow
def test_issue_661_exhaustive_search_agrees() -> None:
    """The optimum over every valid sequence (a few seconds of exhaustive search) is what solve finds."""
    best = exact.search(ISSUE_661, 500)
    assert best is not None and best.peak_bytes <= 500
    assert solve(ISSUE_661, 500, "rotor").predicted_makespan_ms == pytest.approx(best.makespan_ms, abs=1e-9)
    assert pareto_front(ISSUE_661).schedule_at(500).predicted_makespan_ms > best.makespan_ms + 0.5


@given(chain=small_chains(max_length=3, max_size=4), slots=st.integers(4, 30))
@settings(max_examples=30, deadline=None)
def test_rotor_is_the_best_persistent_sequence_on_1_byte_slots(chain: Chain, slots: int) -> None:
    """Budgets of at most ``slots`` bytes are solved exactly, whatever store-all's peak."""
    lowest = exact.min_budget_bytes(chain, persistent=True)
    previous = math.inf
    for budget in range(max(lowest - 1, 0), min(slots, store_all_budget(chain) + 1) + 1):
        best = exact.search(chain, budget, persistent=True)
        if best is None:
            with pytest.raises(InfeasibleBudgetError):
                solve(chain, budget, "rotor", slots)
            continue
        schedule = solve(chain, budget, "rotor", slots)
        assert schedule.params.slot_bytes == 1
        assert schedule.predicted_makespan_ms == pytest.approx(best.makespan_ms, abs=1e-4)
        assert schedule.predicted_peak_bytes <= budget
        assert schedule.predicted_makespan_ms <= previous + 1e-9  # time never rises with the budget
        previous = schedule.predicted_makespan_ms


@pytest.mark.parametrize("algorithm", ["rotor", "revolve", "rotor_optimal"])
@given(chain=small_chains(max_length=4, max_size=400), slots=st.integers(3, 25), data=st.data())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_minimum_is_a_boundary_and_every_budget_above_it_fits(
    algorithm: str, chain: Chain, slots: int, data: st.DataObject
) -> None:
    """Coarse slots: many grids between the minimum and store-all's peak, each budget on its own."""
    try:
        lowest = min_feasible_budget(chain, algorithm, slots)
    except InfeasibleBudgetError:  # revolve may need more than store-all's grid holds
        assert algorithm == "revolve"
        return
    top = store_all_budget(chain)
    solve(chain, lowest, algorithm, slots)
    if lowest > 0:
        with pytest.raises(InfeasibleBudgetError) as excinfo:
            solve(chain, lowest - 1, algorithm, slots)
        assert excinfo.value.min_feasible_bytes == lowest and f"{lowest} bytes" in str(excinfo.value)
    above = data.draw(st.lists(st.integers(lowest, max(lowest, top) + 3), min_size=1, max_size=6))
    for budget in above:
        assert simulate(chain, solve(chain, budget, algorithm, slots).ops).peak_bytes <= budget


def test_a_budget_whose_own_grid_finds_nothing_gets_the_minimums_schedule() -> None:
    # 21 slots: 1533 bytes has slots of 73 bytes and a schedule; 1534 to 1553 have slots of 74 and none
    chain = Chain("coarse", 176, (
        Stage(5.0, 6.0, 37, 148, 37, 23, 31), Stage(8.0, 1.0, 258, 410, 258, 12, 200),
        Stage(5.0, 6.0, 103, 290, 103, 60, 291), Stage(4.0, 1.0, 87, 260, 87, 20, 82),
    ))
    top = store_all_budget(chain)

    def threshold(reference: int) -> int | None:
        return rotor.threshold_bytes(discretize(chain, 21, reference), "rotor", top)

    assert min_feasible_budget(chain, "rotor", 21) == 1533
    own = [budget for budget in range(1500, 1600) if solved_on_own_grid(threshold, budget, top)]
    assert own == [1533, 1554, 1575, 1596]  # the top of each 21-byte run of one slot size
    at_minimum = solve(chain, 1533, "rotor", 21)
    for budget in (1534, 1553):
        above = solve(chain, budget, "rotor", 21)
        assert above.ops == at_minimum.ops and above.params == ScheduleParams(slots=21, slot_bytes=73)
        assert above.predicted_peak_bytes <= 1533


def test_minimum_tests_feasibility_without_filling_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_table(*args: object, **kwargs: object) -> None:
        raise AssertionError("min_feasible_budget must use the feasibility DP, not the table")

    monkeypatch.setattr(rotor_fill, "fill", no_table)
    chain = random_chain(seed=2, length=30)
    assert 0 < min_feasible_budget(chain, "rotor") < store_all_budget(chain)


@pytest.mark.parametrize(("module", "persistent"), [(rotor, True), (rotor_optimal, False)])
@given(chain=small_chains(max_length=3, max_size=4))
@settings(max_examples=20, deadline=None)
def test_floor_is_the_exact_minimum(module: object, persistent: bool, chain: Chain) -> None:
    """The bisection starts at the DP's minimum on 1-byte slots: exhaustive search's minimum."""
    top = store_all_budget(chain)
    if module is rotor:
        floor = exact_floor(lambda count, ref: rotor.threshold_bytes(discretize(chain, count, ref), "rotor", top), top)
    else:
        floor = exact_floor(lambda count, ref: rotor_optimal.threshold_bytes(discretize(chain, count, ref), top), top)
    assert floor == exact.min_budget_bytes(chain, persistent=persistent)


def test_same_grid_budgets() -> None:
    assert same_grid_budgets(7, 10_000, 500) == (0, 500)
    assert same_grid_budgets(501, 10_000, 500) == (501, 1000)
    assert same_grid_budgets(1000, 10_000, 500) == (501, 1000)
    assert same_grid_budgets(9_600, 10_000, 500) == (9_501, math.inf)  # store-all's grid: every budget above
    assert same_grid_budgets(-5, 10_000, 500) == (0, 500)
    assert same_grid_budgets(20_000, 10_000, 500) == (9_501, math.inf)


@st.composite
def thresholds(draw: st.DrawFn) -> tuple[int, int, int, object]:
    """A store-all peak, a slot count and a random threshold per grid: roughly ``base`` plus a few slots of
    rounding, sometimes none, sometimes capped at the peak as rotor's is by store-all."""
    top, slots = draw(st.integers(0, 4000)), draw(st.integers(1, 40))
    base, seed = draw(st.integers(0, max(top, 0))), draw(st.integers(0, 2**32))
    capped, empty = draw(st.booleans()), draw(st.floats(0, 0.3))
    floor = draw(st.integers(0, base))  # every threshold is at least `base`

    @functools.cache
    def by_slot(slot: int) -> int | None:
        rng = random.Random(seed * 7919 + slot)
        count = -(-base // slot) + rng.randint(0, 4)
        found = None if count > slots or rng.random() < empty else count * slot
        return (top if found is None else min(found, top)) if capped else found

    return top, slots, floor, lambda reference: by_slot(slot_bytes_for(reference, slots))


@given(case=thresholds())
@settings(max_examples=300, deadline=None)
def test_lowest_budget_is_a_boundary_found_in_few_tests(case: tuple[int, int, int, object]) -> None:
    top, slots, floor, threshold = case
    calls = []

    def counted(reference: int) -> int | None:
        calls.append(reference)
        return threshold(reference)

    found = lowest_budget(counted, top, slots, floor)
    first = threshold(top)
    if first is None:
        assert found is None
        return
    assert isinstance(found, Minimum) and floor <= found.budget_bytes <= first
    assert len(calls) <= 2 * max(first - floor, 1).bit_length() + 2
    assert lowest_budget(threshold, top, slots) == found or floor > 0  # the floor only saves tests
    boundaries = lowest_budget_reference(threshold, top)
    if solved_on_own_grid(threshold, found.budget_bytes, top):
        assert found.budget_bytes in boundaries
    else:  # nothing below store-all's grid's threshold: solved there
        assert found == Minimum(first, top)
        assert first == 0 or not solved_on_own_grid(threshold, first - 1, top)
    assert threshold(found.reference_bytes) <= found.budget_bytes  # the grid it names solves it
