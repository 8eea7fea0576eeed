"""Binomial checkpointing: Griewank's counts, the size bound, the budget contract, rotor's fallback to it."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import FallbackWarning, InfeasibleBudgetError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import predict, simulate
from planner.solvers import binomial, rotor
from planner.solvers.binomial_split import (
    advances,
    beta,
    binomial_ops,
    forward_count,
    repetitions,
    split,
)
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.reference.binomial import advances_brute_force
from tests.planner.chain_strategies import random_chain, small_chains


def forwards(ops: tuple[Op, ...]) -> int:
    """Every forward of a schedule: F_ck, F_none and F_all (the convention of ``forward_count``)."""
    return sum(op.kind is not OpKind.B for op in ops)


def uniform_chain(length: int, size: int = 100, forward_overhead: int = 0) -> Chain:
    """``length`` identical stages plus an identical loss: Griewank's setting."""
    stage = Stage(1.0, 2.0, size, size, size, forward_overhead_bytes=forward_overhead)
    return Chain("uniform", size, (stage,) * (length + 1))


@pytest.mark.parametrize(("steps", "snapshots", "expected"), [(100, 10, 322), (1000, 10, 4636)])
def test_the_known_optimal_counts(steps: int, snapshots: int, expected: int) -> None:
    """Every forward counted, taped ones included: 222 + 100 and 3,636 + 1,000."""
    assert forward_count(steps, snapshots) == expected
    assert advances(steps, snapshots) == expected - steps
    assert forwards(binomial_ops(steps - 1, snapshots)) == expected  # n = L + 1 steps: the loss is one


def test_solve_at_ten_snapshots_takes_the_optimal_count() -> None:
    chain = uniform_chain(99)
    budget = int(binomial.memory_bounds(chain)[10])
    schedule = solve(chain, budget, "binomial")
    assert schedule.algorithm == "binomial" and schedule.params.snapshots == 10
    assert forwards(schedule.ops) == schedule.params.forwards == 322
    assert schedule.predicted_peak_bytes == budget  # the bound is exact on a uniform chain
    assert solve(chain, budget - 1, "binomial").params.snapshots == 9


@pytest.mark.parametrize("steps", range(1, 41))
def test_counts_equal_the_brute_force_over_every_split(steps: int) -> None:
    for snapshots in range(1, 7):
        expected = advances_brute_force(steps, snapshots)
        assert advances(steps, snapshots) == expected, (steps, snapshots)
        if steps >= 2:
            assert forwards(binomial_ops(steps - 1, snapshots)) == expected + steps, (steps, snapshots)


def test_closed_form_pieces() -> None:
    assert [beta(2, r) for r in range(4)] == [1, 3, 6, 10]
    assert beta(3, -1) == 0 and beta(-1, 3) == 0
    assert repetitions(1, 5) == 0 and repetitions(7, 1) == 6 and repetitions(6, 2) == 2 and repetitions(7, 2) == 3
    assert advances(30, 1) == 30 * 29 // 2  # one snapshot: advance from a^0 every time
    assert all(1 <= split(n, s, repetitions(n, s)) < n for n in range(2, 60) for s in range(1, 8))
    with pytest.raises(ValueError, match="need at least 1 snapshot"):
        repetitions(3, 0)
    with pytest.raises(ValueError, match="at least 1 snapshot"):
        binomial_ops(5, 0)


@pytest.mark.parametrize("length", [1, 2, 5, 17, 60])
def test_snapshots_beyond_the_chain_change_nothing(length: int) -> None:
    assert binomial_ops(length, length) == binomial_ops(length, length + 7)
    assert forwards(binomial_ops(length, length)) == 2 * length + 1  # each a^l kept once, each step taped


@given(chain=small_chains(max_length=12, max_size=40), data=st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_bound_holds_wherever_the_snapshots_fall(chain: Chain, data: st.DataObject) -> None:
    bounds = binomial.memory_bounds(chain)
    assert all(later >= earlier for earlier, later in zip(bounds[1:], bounds[2:]))
    snapshots = data.draw(st.integers(1, chain.length))
    assert simulate(chain, binomial_ops(chain.length, snapshots)).peak_bytes <= bounds[snapshots]


@pytest.mark.parametrize("length", [3, 10, 40])
def test_the_bound_is_exact_on_uniform_chains(length: int) -> None:
    chain = uniform_chain(length)
    bounds = binomial.memory_bounds(chain)
    for snapshots in range(1, length + 1):
        assert predict(chain, binomial_ops(length, snapshots))[0] == bounds[snapshots], snapshots


@given(chain=small_chains(max_length=10, max_size=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_budget_from_the_minimum_fits_and_one_byte_below_names_it(chain: Chain) -> None:
    lowest, top = min_feasible_budget(chain, "binomial"), store_all_budget(chain)
    for budget in range(lowest, top + 2):
        schedule = solve(chain, budget, "binomial")
        assert simulate(chain, schedule.ops).peak_bytes <= budget
    with pytest.raises(InfeasibleBudgetError) as excinfo:
        solve(chain, lowest - 1, "binomial")
    assert excinfo.value.min_feasible_bytes == lowest
    assert f"minimum feasible budget for binomial: {lowest} bytes" in str(excinfo.value)


def _uniform_times(chain: Chain) -> Chain:
    stages = tuple(Stage(1.0, 1.0, s.output_bytes, s.saved_bytes, s.grad_bytes, s.forward_overhead_bytes,
                         s.backward_overhead_bytes, weight_grad_bytes=s.weight_grad_bytes) for s in chain.stages)
    return Chain(chain.name, chain.input_bytes, stages)


@given(chain=small_chains(max_length=10, max_size=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_more_budget_never_means_more_forwards(chain: Chain) -> None:
    """Monotone in the snapshot count: the snapshots never fall and the forwards never rise as the budget
    grows; with equal stage times the makespan never rises either."""
    chain = _uniform_times(chain)
    lowest, top = min_feasible_budget(chain, "binomial"), store_all_budget(chain)
    previous = None
    for budget in range(lowest, top + 2):
        schedule = solve(chain, budget, "binomial")
        here = (forwards(schedule.ops), schedule.predicted_makespan_ms)
        if previous is not None:
            assert here[0] <= previous[0] and here[1] <= previous[1] + 1e-9, budget
        previous = here


@given(chain=small_chains(max_length=7, max_size=20))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_never_faster_than_the_optimal_dynamic_programs(chain: Chain) -> None:
    """At equal budget (1-byte slots: exact) rotor's persistent optimum, and revolve's whenever binomial
    is not store-all, are at least as fast: binomial is one revolve schedule among those they search."""
    lowest, top = min_feasible_budget(chain, "binomial"), store_all_budget(chain)
    for budget in sorted({lowest, (lowest + top) // 2, top}):
        found = solve(chain, budget, "binomial")
        slots = max(budget, 1)
        assert solve(chain, budget, "rotor", slots=slots).predicted_makespan_ms <= found.predicted_makespan_ms + 1e-9
        if not found.params.store_all:
            best = solve(chain, budget, "revolve", slots=slots).predicted_makespan_ms
            assert best <= found.predicted_makespan_ms + 1e-9


def test_store_all_at_its_own_peak() -> None:
    chain = random_chain(seed=5, length=20)
    top = store_all_budget(chain)
    assert solve(chain, top, "binomial").params == ScheduleParams(store_all=True)
    below = solve(chain, top - 1, "binomial")
    assert not below.params.store_all and below.predicted_makespan_ms > solve(chain, top, "binomial").predicted_makespan_ms


def test_schedules_longer_than_the_cap_are_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = uniform_chain(60)
    fewest = binomial.fewest_snapshots(60, 400)
    assert fewest is not None and binomial.operation_count(60, fewest) <= 400 < binomial.operation_count(60, fewest - 1)
    monkeypatch.setattr(binomial, "MAX_OPS", 400)
    lowest = min_feasible_budget(chain, "binomial")
    assert lowest == binomial.memory_bounds(chain)[fewest]
    assert len(solve(chain, lowest, "binomial").ops) <= 400
    with pytest.raises(InfeasibleBudgetError, match=f"fewer than {fewest} snapshots would take more than 400 "
                                                    f"operations") as excinfo:
        solve(chain, lowest - 1, "binomial")
    assert excinfo.value.min_feasible_bytes == lowest
    monkeypatch.setattr(binomial, "MAX_OPS", 100)  # not even every a^l kept fits: store-all only
    assert binomial.fewest_snapshots(60) is None
    assert min_feasible_budget(chain, "binomial") == store_all_budget(chain)


def test_the_seeds_bisection_never_beats_the_binomial_split() -> None:
    """At the bisection's own peak on a uniform chain, binomial fits at least as many snapshots and
    takes fewer forwards (the seed's divide-and-conquer is the balanced binomial split)."""
    for length in (15, 99, 400):
        chain = uniform_chain(length)
        halves = binomial.bisection_ops(length)
        peak, _ = predict(chain, halves)
        depth = math.ceil(math.log2(length + 1))
        assert peak <= binomial.memory_bounds(chain)[depth + 1]
        schedule = solve(chain, peak, "binomial")
        assert forwards(schedule.ops) < forwards(halves), length


def test_rotor_falls_back_to_binomial_when_its_table_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = random_chain(seed=6, length=40)
    budget = store_all_budget(chain) // 2
    needed = rotor.table_bytes_estimate(40, 500)
    assert needed == 2 * rotor.compute_table(chain, 500).table_bytes  # the cost table and its shifted copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # under the limit: no warning
        assert solve(chain, budget, "rotor").algorithm == "rotor"
    monkeypatch.setattr(rotor, "MAX_TABLE_BYTES", needed // 2)
    with pytest.warns(FallbackWarning, match=rf"rotor on 40 stages with 500 slots: its tables would take about "
                                             rf"6\.4 MiB \({needed} bytes\), over the 3\.2 MiB \({needed // 2} "
                                             rf"bytes\) allowed .*binomial") as caught:
        schedule = solve(chain, budget, "rotor")
    assert caught[0].filename == __file__  # points at the caller of solve
    assert schedule.algorithm == "binomial"
    assert schedule.params.fallback_from == "rotor"
    assert schedule.params.table_bytes_estimate == needed and schedule.params.max_table_bytes == needed // 2
    assert schedule.ops == solve(chain, budget, "binomial").ops
    with pytest.warns(FallbackWarning):
        assert min_feasible_budget(chain, "rotor") == min_feasible_budget(chain, "binomial")


def test_default_limit_keeps_rotor_up_to_l_339_and_hands_over_beyond_517() -> None:
    assert rotor.MAX_TABLE_BYTES == 2**30
    assert rotor.table_bytes_estimate(339, 500) <= rotor.MAX_TABLE_BYTES < rotor.table_bytes_estimate(517, 500)
    assert rotor.table_bytes_estimate(516, 500) <= rotor.MAX_TABLE_BYTES
