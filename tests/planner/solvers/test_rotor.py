"""The persistent DP (rotor, and revolve): fast == slow reference, == exhaustive persistent optimum, the toy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.model.schedule import OpKind
from planner.simulation.simulator import simulate
from planner.solvers import exact, rotor, rotor_fill
from planner.solvers.discretize import discretize
from planner.solvers.reference.rotor import ReferencePersistent
from tests.planner.chain_strategies import MIB, exact_grid, random_chain, small_chains, toy_chain
from tests.planner.simulation.test_simulator import PAPER_90MB


def assert_tables_equal(table: rotor.RotorTable, reference: ReferencePersistent) -> None:
    for (s, t), row in reference.cost.items():
        expected = np.array(row)
        found = table.row(s, t).astype(np.float64)
        assert (np.isinf(expected) == np.isinf(found)).all(), f"feasibility differs at C({s}, {t}, .)"
        finite = np.isfinite(expected)
        np.testing.assert_allclose(found[finite], expected[finite], rtol=1e-5, atol=1e-4, err_msg=f"C({s}, {t}, .)")


@pytest.mark.parametrize("mode", ["rotor", "revolve"])
@given(chain=small_chains(max_length=7))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_table_equals_reference_exactly_sized(mode: str, chain: Chain) -> None:
    grid = exact_grid(chain)
    assert_tables_equal(rotor.compute_table(chain, grid=grid, mode=mode), ReferencePersistent(grid, mode))


@pytest.mark.parametrize("mode", ["rotor", "revolve"])
@given(chain=small_chains(max_length=9, max_size=5000), slots=st.integers(8, 40))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_table_equals_reference_on_coarse_slots(mode: str, chain: Chain, slots: int) -> None:
    grid = discretize(chain, slots)
    assert_tables_equal(rotor.compute_table(chain, grid=grid, mode=mode), ReferencePersistent(grid, mode))


def first_finite(row: np.ndarray) -> float:
    """The first memory with a finite value (inf: none)."""
    finite = np.flatnonzero(np.isfinite(row))
    return float(finite[0]) if finite.size else np.inf


@pytest.mark.parametrize("mode", ["rotor", "revolve"])
@given(chain=small_chains(max_length=7, max_size=5000), slots=st.integers(3, 40))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_least_memory_is_where_each_row_becomes_finite(mode: str, chain: Chain, slots: int) -> None:
    """The feasibility DP against the slow reference table, row by row; every memory above is feasible."""
    grid = discretize(chain, slots)
    need = rotor_fill.least_memory(grid, mode)
    for (s, t), row in ReferencePersistent(grid, mode).cost.items():
        assert first_finite(np.array(row)) == need[s, t], f"C({s}, {t}, .)"
        assert np.isinf(need[s, t]) or np.isfinite(row[int(need[s, t]):]).all()
    table = rotor.compute_table(chain, grid=grid, mode=mode)
    assert rotor.threshold_bytes(grid, mode, table.store_all_bytes) == table.min_feasible_bytes()


def test_least_memory_on_a_longer_chain() -> None:
    chain = random_chain(seed=3, length=30)
    for slots in (60, 500):
        grid = discretize(chain, slots)
        table = rotor.compute_table(chain, grid=grid)
        need = rotor_fill.least_memory(grid, "rotor")
        for s in range(1, grid.top + 1):
            for t in range(s, grid.top + 1):
                assert first_finite(table.row(s, t)) == need[s, t]


def test_fast_table_equals_reference_on_a_longer_chain() -> None:
    chain = random_chain(seed=3, length=14)  # long enough for the memory windows to matter
    grid = discretize(chain, 60)
    assert_tables_equal(rotor.compute_table(chain, grid=grid), ReferencePersistent(grid))


@pytest.mark.parametrize("mode", ["rotor", "revolve"])
@given(chain=small_chains(max_length=6))
@settings(max_examples=25, deadline=None)
def test_rebuilt_schedules_are_the_reference_optimum_and_fit(mode: str, chain: Chain) -> None:
    grid = exact_grid(chain)
    table = rotor.compute_table(chain, grid=grid, mode=mode)
    reference = ReferencePersistent(grid, mode)
    for budget in range(grid.slots + 1):
        expected = reference.ops(budget)
        if expected is None:
            with pytest.raises(InfeasibleBudgetError):
                rotor.rebuild(table, budget)
            continue
        prediction = simulate(chain, rotor.rebuild(table, budget))
        assert prediction.peak_bytes <= budget
        assert prediction.makespan_ms == pytest.approx(simulate(chain, expected).makespan_ms, abs=1e-6)


@given(chain=small_chains(max_length=3, max_size=4))
@settings(max_examples=30, deadline=None)
def test_rotor_is_the_optimum_over_all_persistent_sequences(chain: Chain) -> None:
    """Proves, on these chains, Theorem 4.8 in our memory model: the DP == exhaustive persistent search."""
    grid = exact_grid(chain)
    table = rotor.compute_table(chain, grid=grid)
    found = table.root_makespans()
    lowest = exact.min_budget_bytes(chain, persistent=True)
    for budget in range(max(lowest - 1, 0), grid.slots + 1, 2):
        best = exact.search(chain, budget, persistent=True)
        if best is None:
            assert not np.isfinite(found[budget])
        else:
            assert found[budget] == pytest.approx(best.makespan_ms, abs=1e-4)


def test_toy_90_mb_gives_the_papers_sequence() -> None:
    chain = toy_chain()
    table = rotor.compute_table(chain, 500)
    ops = rotor.rebuild(table, 90 * MIB)
    assert list(ops) == PAPER_90MB
    prediction = simulate(chain, ops)
    assert prediction.makespan_ms == pytest.approx(47.42, abs=1e-9)
    assert prediction.peak_bytes <= 90 * MIB


def test_revolve_only_records_right_before_backward() -> None:
    chain = random_chain(seed=5, length=20)
    table = rotor.compute_table(chain, 200, mode="revolve")
    for fraction in (0.3, 0.5, 0.8, 1.0):
        budget = int(table.store_all_bytes * fraction)
        try:
            ops = rotor.rebuild(table, budget)
        except InfeasibleBudgetError:
            continue
        pairs = list(zip(ops, ops[1:]))
        assert all(b.kind is OpKind.B and b.stage == a.stage for a, b in pairs if a.kind is OpKind.F_ALL)
        assert simulate(chain, ops).peak_bytes <= budget


def test_infeasible_budget_names_the_minimum() -> None:
    chain = toy_chain()
    table = rotor.compute_table(chain, 500)
    lowest = table.min_feasible_bytes()
    rotor.rebuild(table, lowest)
    with pytest.raises(InfeasibleBudgetError) as excinfo:
        rotor.rebuild(table, lowest - 1)
    assert excinfo.value.min_feasible_bytes == lowest
    assert str(lowest) in str(excinfo.value) and "MiB" in str(excinfo.value)
