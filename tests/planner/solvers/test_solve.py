"""solve(): dispatch, errors that name the minimum, predictions filled in, the toy example end to end."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings

from memprof.units import format_bytes
from planner import (
    ALGORITHMS,
    Chain,
    InfeasibleBudgetError,
    Schedule,
    SearchTooLargeError,
    TableTooLargeError,
    UnknownAlgorithmError,
    simulate,
    solve,
)
from planner.solvers.dispatch import min_feasible_budget, store_all_budget
from planner.solvers.store_all import store_all_ops
from tests.planner.chain_strategies import MIB, random_chain, small_chains, toy_chain


def test_algorithm_names() -> None:
    assert ALGORITHMS == ("store_all", "periodic", "sqrt", "revolve", "rotor", "rotor_optimal", "binomial", "offload",
                          "selective")


def test_unknown_algorithm_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownAlgorithmError, match="unknown algorithm 'chen'; expected one of store_all, periodic, "
                                                    "sqrt, revolve, rotor, rotor_optimal, binomial, offload, selective, exact"):
        solve(toy_chain(), 90 * MIB, "chen")


@pytest.mark.parametrize("algorithm", ["rotor", "rotor_optimal"])
def test_toy_example_90_mb(algorithm: str) -> None:
    schedule = solve(toy_chain(), 90 * MIB, algorithm)
    assert schedule.algorithm == algorithm and schedule.budget_bytes == 90 * MIB
    assert schedule.predicted_makespan_ms == pytest.approx(47.4, abs=0.05)
    assert schedule.predicted_peak_bytes <= 90 * MIB
    assert schedule.params.slots == 500


def test_prediction_is_the_simulators() -> None:
    chain = random_chain(seed=4, length=12)
    schedule = solve(chain, store_all_budget(chain) // 2)
    prediction = simulate(chain, schedule)
    assert (schedule.predicted_peak_bytes, schedule.predicted_makespan_ms) == (
        prediction.peak_bytes, prediction.makespan_ms)
    again = Schedule.from_json(schedule.to_json())
    assert again.ops == schedule.ops and again.predicted_makespan_ms == schedule.predicted_makespan_ms


def store_all_peak_by_hand(chain: Chain) -> int:
    """Store-all's peak from the ROTOR paper's memory rules, written out here and not read from the simulator.

    Forward, during F_all(l): the input a^0 and the loss's gradient delta^{L+1} held from the start, every
    a-bar^i recorded below l, and a-bar^l with its overhead o_f^l. Backward, during B(l): a^0, a-bar^1..l,
    delta^l held, delta^{l-1} produced (delta^0 is the size of a^0) and o_b^l. For chains without parameter
    gradients, options, transfers or step costs.
    """
    top = chain.length + 1
    abar = [chain.stage(i).saved_bytes for i in range(1, top + 1)]
    delta = [chain.input_bytes] + [chain.stage(i).grad_bytes for i in range(1, top + 1)]
    forward = [chain.input_bytes + delta[top] + sum(abar[: k - 1]) + abar[k - 1]
               + chain.stage(k).forward_overhead_bytes for k in range(1, top + 1)]
    backward = [chain.input_bytes + sum(abar[:k]) + delta[k] + delta[k - 1] + chain.stage(k).backward_overhead_bytes
                for k in range(1, top + 1)]
    return max(forward + backward)


def test_store_all_budget_is_store_alls_peak() -> None:
    chain = toy_chain()
    assert store_all_budget(chain) == simulate(chain, store_all_ops(chain)).peak_bytes
    # the paper: reached during B^5, 79.35 MB held plus 27.64 MB (107.0 MB, test_simulator.py); here to the byte
    assert store_all_budget(chain) == store_all_peak_by_hand(chain)
    assert store_all_budget(chain) == (chain.input_bytes + sum(chain.stage(i).saved_bytes for i in range(1, 6))
                                       + chain.stage(5).grad_bytes + chain.stage(4).grad_bytes
                                       + chain.stage(5).backward_overhead_bytes)


@given(chain=small_chains(max_length=6, max_size=50))
@settings(max_examples=100, deadline=None)
def test_store_all_budget_is_the_hand_computed_peak(chain: Chain) -> None:
    chain = replace(chain, stages=tuple(replace(s, weight_grad_bytes=0) for s in chain.stages))
    assert store_all_budget(chain) == store_all_peak_by_hand(chain)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_minimum_on_coarse_slots_is_exact_to_the_byte(algorithm: str) -> None:
    chain = toy_chain()  # 500 slots of 224417 bytes
    lowest = min_feasible_budget(chain, algorithm)
    solve(chain, lowest, algorithm)
    for below in (lowest - 1, lowest - 224417):
        with pytest.raises(InfeasibleBudgetError) as excinfo:
            solve(chain, below, algorithm)
        error = excinfo.value
        assert error.min_feasible_bytes == lowest and error.budget_bytes == below
        assert f"{lowest} bytes ({format_bytes(lowest)})" in str(error)


def test_rounding_never_exceeds_the_budget_on_coarse_slots() -> None:
    chain = random_chain(seed=8, length=40)
    top = store_all_budget(chain)
    lowest = min_feasible_budget(chain, "rotor", slots=50)
    for step in range(11):
        budget = lowest + (top - lowest) * step // 10
        schedule = solve(chain, budget, "rotor", slots=50)
        assert simulate(chain, schedule).peak_bytes <= budget


@pytest.mark.parametrize("budget", ["64MiB", 1.5, None, True])
def test_budget_must_be_whole_bytes(budget: object) -> None:
    with pytest.raises(TypeError, match="budget_bytes must be a whole number of bytes"):
        solve(toy_chain(), budget)  # type: ignore[arg-type]


def test_whole_float_budgets_are_accepted() -> None:
    assert solve(toy_chain(), float(90 * MIB)).budget_bytes == 90 * MIB


def test_bad_slots() -> None:
    with pytest.raises(ValueError, match="slots must be a whole number >= 1, found 0"):
        solve(toy_chain(), 90 * MIB, slots=0)


def test_exact_is_for_small_chains_only() -> None:
    with pytest.raises(SearchTooLargeError, match="at most 8 stages"):
        solve(random_chain(seed=1, length=12), 10**12, "exact")


def test_rotor_optimal_refuses_tables_that_would_not_fit() -> None:
    chain = random_chain(seed=1, length=100)
    with pytest.raises(TableTooLargeError, match=r"about 2\.0 GiB of tables for 100 stages and 500 slots"):
        solve(chain, store_all_budget(chain) // 2, "rotor_optimal")
    with pytest.raises(TableTooLargeError, match=r"about 2\.0 GiB of tables for 100 stages and 500 slots"):
        min_feasible_budget(chain, "rotor_optimal")
    shorter = random_chain(seed=1, length=20)
    assert solve(shorter, store_all_budget(shorter) // 2, "rotor_optimal").predicted_peak_bytes > 0
