"""The baselines' exact operation sequences, and properties every solver must satisfy."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind
from planner.simulation.simulator import simulate
from planner.solvers import periodic, sqrt, store_all
from planner.solvers.dispatch import ALGORITHMS, min_feasible_budget, solve, store_all_budget
from tests.planner.chain_strategies import random_chain, small_chains
from tests.planner.simulation.test_simulator import ops


def test_store_all_sequence() -> None:
    chain = random_chain(seed=1, length=3)
    assert list(store_all.store_all_ops(chain)) == ops("F_all 1, F_all 2, F_all 3, F_all 4, B 4, B 3, B 2, B 1")


def test_periodic_is_checkpoint_sequential() -> None:
    # checkpoint_sequential(7 layers, 3 segments): size 7 // 3 = 2; layers 1-2 and 3-4 checkpointed,
    # 5-7 (the rest) run normally with the loss (stage 8); backward re-runs 3-4, then 1-2.
    chain = random_chain(seed=1, length=7)
    expected = ops(
        "F_ck 1, F_none 2, F_ck 3, F_none 4, F_all 5, F_all 6, F_all 7, F_all 8, B 8, B 7, B 6, B 5, "
        "F_all 3, F_all 4, B 4, B 3, F_all 1, F_all 2, B 2, B 1"
    )
    assert list(periodic.periodic_ops(chain, 3)) == expected
    assert periodic.periodic_ops(chain, 1) == store_all.store_all_ops(chain)
    # 7 segments of 1 stage: each of the first 6 keeps its input; the 7th runs normally
    seven = periodic.periodic_ops(chain, 7)
    assert [op for op in seven[:6]] == [Op(OpKind.F_CK, i) for i in range(1, 7)]
    assert sum(op.kind is OpKind.F_ALL for op in seven) == 8


@pytest.mark.parametrize("segments", [0, 8, -1, True])
def test_periodic_segment_count_is_checked(segments: int) -> None:
    with pytest.raises(ValueError, match=r"segments must be a whole number in 1\.\.7"):
        periodic.periodic_ops(random_chain(seed=1, length=7), segments)


def test_periodic_keeps_the_fastest_fitting_segment_count() -> None:
    chain = random_chain(seed=2, length=12)
    options = periodic.candidates(chain)
    budget = sorted(peak for _, peak, _ in options)[len(options) // 2]
    chosen = periodic.plan(chain, budget)
    best = min(makespan for _, peak, makespan in options if peak <= budget)
    assert simulate(chain, chosen.ops).makespan_ms == best
    assert periodic.periodic_ops(chain, chosen.params.segments) == chosen.ops


def test_sqrt_checkpoints_every_sqrt_l_stages() -> None:
    chain = random_chain(seed=1, length=10)  # round(sqrt(10)) = 3: checkpoints a^0, a^3, a^6, a^9
    expected = ops(
        "F_ck 1, F_none 2, F_none 3, F_ck 4, F_none 5, F_none 6, F_ck 7, F_none 8, F_none 9, F_all 10, F_all 11, "
        "B 11, B 10, F_all 7, F_all 8, F_all 9, B 9, B 8, B 7, F_all 4, F_all 5, F_all 6, B 6, B 5, B 4, "
        "F_all 1, F_all 2, F_all 3, B 3, B 2, B 1"
    )
    assert list(sqrt.sqrt_ops(chain)) == expected
    assert sqrt.sqrt_ops(random_chain(seed=1, length=1)) == store_all.store_all_ops(random_chain(seed=1, length=1))


def _feasible_budgets(chain: Chain, algorithm: str) -> list[int]:
    lowest, top = min_feasible_budget(chain, algorithm), store_all_budget(chain)
    # revolve checkpoints where store-all records, so its minimum can lie above store-all's peak
    return sorted(b for b in {lowest, (lowest + top) // 2, top, top + 5} if b >= lowest)


# found by hypothesis in CI: revolve's minimum (3 bytes) above store-all's peak (2 bytes)
_ABOVE_STORE_ALL = Chain("random", 0, (Stage(0.0, 0.0, 1, 1, 1, forward_overhead_bytes=1), Stage(0.0, 0.0, 0, 0, 0)))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(chain=small_chains(max_length=6))
@example(chain=_ABOVE_STORE_ALL)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_schedules_fit_their_budget_and_one_below_the_minimum_fails(algorithm: str, chain: Chain) -> None:
    lowest = min_feasible_budget(chain, algorithm)
    for budget in _feasible_budgets(chain, algorithm):
        schedule = solve(chain, budget, algorithm)
        assert simulate(chain, schedule.ops).peak_bytes <= budget
    with pytest.raises(InfeasibleBudgetError) as excinfo:
        solve(chain, lowest - 1, algorithm)  # 1-byte slots here: one slot below
    assert excinfo.value.min_feasible_bytes == lowest


@pytest.mark.parametrize("algorithm", ["rotor", "rotor_optimal", "revolve"])
@given(chain=small_chains(max_length=6))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_makespan_never_rises_with_the_budget(algorithm: str, chain: Chain) -> None:
    lowest, top = min_feasible_budget(chain, algorithm), store_all_budget(chain)
    makespans = [solve(chain, budget, algorithm).predicted_makespan_ms for budget in range(lowest, top + 2)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(makespans, makespans[1:]))


@given(chain=small_chains(max_length=6))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_optimal_beats_rotor_beats_the_baselines(chain: Chain) -> None:
    """At equal budget (exact 1-byte slots): rotor_optimal <= rotor <= revolve, periodic, sqrt, store_all."""
    baselines = ("revolve", "periodic", "sqrt", "store_all")
    budgets = {min_feasible_budget(chain, name) for name in (*baselines, "rotor")}
    for budget in sorted(budgets | {store_all_budget(chain) // 2}):
        def makespan(name: str, budget: int = budget) -> float:
            try:
                return solve(chain, budget, name).predicted_makespan_ms
            except InfeasibleBudgetError:
                return math.inf
        best, persistent = makespan("rotor_optimal"), makespan("rotor")
        assert best <= persistent + 1e-9
        for name in baselines:
            assert persistent <= makespan(name) + 1e-9, name
