"""The selective DP: fast == slow reference == exhaustive search over options and sequences; solve's properties."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.simulation.simulator import predict, simulate
from planner.solvers import exact, rotor, rotor_fill, selective
from planner.solvers.budget_grid import same_grid_budgets
from planner.solvers.discretize import discretize
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.option_grid import OptionGrid
from planner.solvers.reference.selective import ReferenceSelective
from tests.planner.chain_strategies import (
    exact_grid,
    option_chains,
    random_chain,
    random_option_chain,
    small_chains,
)
from tests.planner.solvers.test_rotor import first_finite

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_table_equals_reference(table: selective.SelectiveTable, reference: ReferenceSelective) -> None:
    for (s, t), row in reference.cost.items():
        expected = np.array(row)
        found = table.cost[t - s, s - 1].astype(np.float64)
        assert (np.isinf(expected) == np.isinf(found)).all(), f"feasibility differs at C({s}, {t}, .)"
        finite = np.isfinite(expected)
        np.testing.assert_allclose(found[finite], expected[finite], rtol=1e-5, atol=1e-4, err_msg=f"C({s}, {t}, .)")


@given(chain=option_chains(max_length=6))
@settings(SLOW, max_examples=40)
def test_fast_table_equals_reference_exactly_sized(chain: Chain) -> None:
    grid = exact_grid(chain)
    assert_table_equals_reference(selective.compute_table(chain, grid=grid), ReferenceSelective(grid))


@given(chain=option_chains(max_length=9, max_size=5000), slots=st.integers(8, 40))
@settings(SLOW, max_examples=25)
def test_fast_table_equals_reference_on_coarse_slots(chain: Chain, slots: int) -> None:
    grid = discretize(chain, slots)
    assert_table_equals_reference(selective.compute_table(chain, grid=grid), ReferenceSelective(grid))


@given(chain=small_chains(max_length=8, max_size=5000), slots=st.integers(3, 60))
@settings(SLOW, max_examples=30)
def test_without_options_the_table_is_rotors(chain: Chain, slots: int) -> None:
    grid = discretize(chain, slots)
    found, expected = selective.compute_table(chain, grid=grid).cost, rotor.compute_table(chain, grid=grid).cost
    for d in range(grid.top):  # only entries with t <= L+1 are defined
        np.testing.assert_array_equal(found[d, : grid.top - d], expected[d, : grid.top - d])


@given(chain=option_chains(max_length=7, max_size=5000), slots=st.integers(3, 40))
@settings(SLOW, max_examples=50)
def test_least_memory_is_where_each_row_becomes_finite(chain: Chain, slots: int) -> None:
    grid = discretize(chain, slots)
    need = rotor_fill.least_memory(grid, "rotor", OptionGrid.of_grid(grid))
    for (s, t), row in ReferenceSelective(grid).cost.items():
        assert first_finite(np.array(row)) == need[s, t], f"C({s}, {t}, .)"
    table = selective.compute_table(chain, grid=grid)
    assert selective.threshold_bytes(grid, table.store_all_bytes) == table.min_feasible_bytes()


@given(chain=option_chains(max_length=5))
@settings(SLOW, max_examples=25)
def test_rebuilt_schedules_are_the_reference_optimum_and_fit(chain: Chain) -> None:
    grid = exact_grid(chain)
    table = selective.compute_table(chain, grid=grid)
    reference = ReferenceSelective(grid)
    for budget in range(grid.slots + 1):
        expected = reference.ops(budget)
        if expected is None:
            with pytest.raises(InfeasibleBudgetError):
                selective.rebuild(table, budget)
            continue
        peak, makespan = predict(chain, selective.rebuild(table, budget))
        assert peak <= budget
        assert makespan == pytest.approx(predict(chain, expected)[1], abs=1e-6)


@given(chain=option_chains(max_length=3, max_size=4, max_options=2))
@settings(SLOW, max_examples=30)
def test_selective_is_the_optimum_over_all_persistent_sequences_and_options(chain: Chain) -> None:
    """The DP == exhaustive search over every persistent sequence, each F_all with any option."""
    grid = exact_grid(chain)
    found = selective.compute_table(chain, grid=grid).root_makespans()
    lowest = exact.min_budget_bytes(chain, persistent=True)
    for budget in range(max(lowest - 1, 0), grid.slots + 1):
        best = exact.search(chain, budget, persistent=True)
        if best is None:
            assert not np.isfinite(found[budget])
        else:
            assert found[budget] == pytest.approx(best.makespan_ms, abs=1e-4)
            assert simulate(chain, best.ops).makespan_ms == pytest.approx(best.makespan_ms)


def budgets_between(chain: Chain, count: int) -> list[int]:
    """``count + 1`` budgets from the minimum to store-all's peak that share one grid (store-all's).

    Each budget is solved on its own grid (``planner/solvers/budget_grid.py``): across grids a larger budget
    can round a stage's bytes up where a smaller one did not, so time never rises with the budget *on one
    grid*, as for rotor (tests/planner/solvers/test_budget_grid.py).
    """
    low, high = min_feasible_budget(chain, "selective", 40), store_all_budget(chain)
    low = max(low, int(same_grid_budgets(high, high, 40)[0]))
    return sorted({low + (high - low) * i // count for i in range(count + 1)})


@given(chain=option_chains(max_length=6, max_size=5000))
@settings(SLOW, max_examples=20)
def test_solve_fits_never_slows_with_budget_and_beats_rotor(chain: Chain) -> None:
    previous = np.inf
    for budget in budgets_between(chain, 8):
        schedule = solve(chain, budget, "selective", slots=40)
        assert schedule.predicted_peak_bytes is not None and schedule.predicted_peak_bytes <= budget
        assert schedule.predicted_makespan_ms is not None
        assert schedule.predicted_makespan_ms <= previous * (1 + 1e-6) + 1e-9
        previous = schedule.predicted_makespan_ms
        try:
            plain = solve(chain, budget, "rotor", slots=40)
        except InfeasibleBudgetError:
            continue
        assert plain.predicted_makespan_ms is not None
        assert schedule.predicted_makespan_ms <= plain.predicted_makespan_ms * (1 + 1e-5) + 1e-6


@given(chain=option_chains(max_length=6, max_size=5000))
@settings(SLOW, max_examples=20)
def test_one_byte_under_the_minimum_names_it(chain: Chain) -> None:
    lowest = min_feasible_budget(chain, "selective", 40)
    solve(chain, lowest, "selective", slots=40)
    with pytest.raises(InfeasibleBudgetError) as excinfo:
        solve(chain, lowest - 1, "selective", slots=40)
    assert excinfo.value.min_feasible_bytes == lowest
    assert str(lowest) in str(excinfo.value)


def test_with_enough_memory_selective_is_store_all() -> None:
    chain = random_option_chain(seed=4, length=12, options=3)
    schedule = solve(chain, store_all_budget(chain), "selective")
    assert schedule.ops == solve(chain, store_all_budget(chain), "store_all").ops


def test_options_lower_the_minimum_and_the_time_on_a_longer_chain() -> None:
    chain = random_option_chain(seed=7, length=20, options=3)
    plain = replace(chain, stages=tuple(replace(stage, options=()) for stage in chain.stages))
    assert min_feasible_budget(chain, "selective") <= min_feasible_budget(plain, "rotor")
    budget = (min_feasible_budget(plain, "rotor") + store_all_budget(chain)) // 2
    picked = solve(chain, budget, "selective")
    assert picked.predicted_makespan_ms is not None and picked.predicted_peak_bytes is not None
    assert picked.predicted_peak_bytes <= budget
    rotor_time = solve(plain, budget, "rotor").predicted_makespan_ms
    assert rotor_time is not None and picked.predicted_makespan_ms <= rotor_time * (1 + 1e-6)
    assert any(op.option for op in picked.ops), "some recorded forward should keep less than everything"


def test_without_options_solve_equals_rotor() -> None:
    chain = random_chain(seed=2, length=16)
    for fraction in (0.4, 0.6, 0.9):
        budget = int(store_all_budget(chain) * fraction)
        try:
            expected = solve(chain, budget, "rotor")
        except InfeasibleBudgetError:
            with pytest.raises(InfeasibleBudgetError):
                solve(chain, budget, "selective")
            continue
        assert solve(chain, budget, "selective").ops == expected.ops
