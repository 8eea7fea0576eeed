"""The held-memory budget: DP == exhaustive search over options; never over the budget; recomputation never
rises as the budget grows; one slot under the minimum raises, naming it; the simulator agrees on what is held."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import solve_held
from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.simulation.simulator import simulate
from planner.solvers import held
from planner.solvers.reference import held as held_reference
from planner.solvers.store_all import store_all_ops
from tests.planner.chain_strategies import option_chains, random_option_chain

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def recompute_ms(chain: Chain, options: tuple[int, ...]) -> float:
    return sum(stage.recompute_ms_with(k) for stage, k in zip(chain.stages, options, strict=False))


@given(chain=option_chains(max_length=6))
@settings(SLOW, max_examples=40)
def test_on_a_one_byte_grid_the_dp_is_the_exhaustive_optimum_at_every_budget(chain: Chain) -> None:
    table = held.compute_table(chain)
    assert table.slot_bytes == 1  # the chain holds fewer bytes than there are slots
    for budget in range(held.store_all_held_bytes(chain) + 2):
        expected = held_reference.search(chain, budget)
        if expected is None:
            with pytest.raises(InfeasibleBudgetError):
                held.rebuild(table, budget)
            continue
        options = held.rebuild(table, budget)
        assert held.held_bytes(chain, options) <= budget
        assert recompute_ms(chain, options) == pytest.approx(expected[0], abs=1e-9)


@given(chain=option_chains(max_length=7, max_size=5000, max_options=3), slots=st.integers(3, 60),
       data=st.data())
@settings(SLOW, max_examples=40)
def test_on_coarse_slots_the_dp_loses_at_most_one_slot_per_stage(chain: Chain, slots: int, data) -> None:  # noqa: ANN001
    table = held.compute_table(chain, slots)
    budget = data.draw(st.integers(table.min_held_bytes(), held.store_all_held_bytes(chain)))
    options = held.rebuild(table, budget)
    assert held.held_bytes(chain, options) <= budget
    found = recompute_ms(chain, options)
    assert found >= held_reference.search(chain, budget)[0] - 1e-9  # never better than the optimum
    rounded = held_reference.search(chain, budget - chain.length * table.slot_bytes)
    if rounded is not None:  # ... and never worse than the optimum one slot per stage lower
        assert found <= rounded[0] + 1e-9


@given(chain=option_chains(max_length=8, max_size=5000), slots=st.integers(3, 200))
@settings(SLOW, max_examples=40)
def test_recomputation_never_rises_as_the_budget_grows(chain: Chain, slots: int) -> None:
    table = held.compute_table(chain, slots)
    low, high = table.min_held_bytes(), held.store_all_held_bytes(chain)
    step = max(1, (high - low) // 50)
    times = [recompute_ms(chain, held.rebuild(table, budget)) for budget in range(low, high + 1, step)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(times, times[1:], strict=False))


@given(chain=option_chains(max_length=6, max_size=5000), slots=st.integers(3, 100))
@settings(SLOW, max_examples=30)
def test_one_slot_under_the_minimum_raises_naming_it(chain: Chain, slots: int) -> None:
    minimum = held.min_held_bytes(chain, slots)
    schedule = solve_held(chain, minimum, slots)
    assert schedule.params.held_bytes <= minimum
    table = held.compute_table(chain, slots)
    if minimum == 0:
        return  # nothing is below the least a grid can ask
    with pytest.raises(InfeasibleBudgetError, match=f"{minimum} bytes") as raised:
        solve_held(chain, minimum - table.slot_bytes, slots)
    assert raised.value.min_feasible_bytes == minimum


def test_at_store_alls_held_bytes_nothing_is_recomputed() -> None:
    chain = random_option_chain(3, 8, 3)
    schedule = solve_held(chain, held.store_all_held_bytes(chain))
    assert schedule.ops == store_all_ops(chain)
    assert schedule.params.held_bytes == held.store_all_held_bytes(chain)


def test_the_simulator_holds_what_the_options_keep_when_the_loss_starts() -> None:
    chain = random_option_chain(5, 10, 4)
    full = simulate(chain, store_all_ops(chain)).timeline
    low, high = held.min_held_bytes(chain), held.store_all_held_bytes(chain)
    for fraction in (0.0, 0.3, 0.7):
        schedule = solve_held(chain, int(low + fraction * (high - low)))
        assert schedule.params.held_bytes <= schedule.budget_bytes
        timeline = simulate(chain, schedule.ops).timeline
        before_loss = chain.length - 1  # the point after F_all(L)
        assert (timeline[before_loss].memory_bytes - full[before_loss].memory_bytes
                == schedule.params.held_bytes - held.store_all_held_bytes(chain))
        assert schedule.predicted_makespan_ms == pytest.approx(
            simulate(chain, store_all_ops(chain)).makespan_ms + recompute_ms(chain, tuple(schedule.params.options)))


def test_bad_budgets_and_slots_say_what_was_expected() -> None:
    chain = random_option_chain(1, 4, 2)
    with pytest.raises(TypeError, match="whole number of bytes"):
        solve_held(chain, "64MiB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slots must be a whole number >= 1"):
        solve_held(chain, 10**9, slots=0)


def test_a_chain_without_options_says_how_to_get_some() -> None:
    chain = random_option_chain(2, 4, 0)
    assert held.min_held_bytes(chain) == held.store_all_held_bytes(chain)
    with pytest.raises(InfeasibleBudgetError, match="no stage has recomputation options: record the ops"):
        solve_held(chain, held.store_all_held_bytes(chain) - 1)
