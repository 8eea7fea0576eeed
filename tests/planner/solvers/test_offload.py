"""The offload DP against the exhaustive enumeration of its family, its table against the simulator, and its
properties: budget and host cap kept, time never rising with the budget or the bandwidth, rotor as a special case."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain, Stage
from planner.model.schedule import OpKind
from planner.model.transfer import TransferCosts
from planner.simulation.simulator import predict_with_host, simulate
from planner.solvers import offload
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.reference import offload as offload_reference
from planner.solvers.store_all import store_all_peak_bytes
from tests.planner.chain_strategies import offload_chains, random_chain

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _makespan(chain: Chain, budget: int, algorithm: str = "offload") -> float:
    try:
        return solve(chain, budget, algorithm).predicted_makespan_ms
    except InfeasibleBudgetError:
        return math.inf


def _budgets(chain: Chain) -> range:
    return range(max(min_feasible_budget(chain, "offload") - 1, 0), store_all_budget(chain) + 2)


def seeded_chain(seed: int, length: int) -> Chain:
    """A small chain (sizes of a few bytes: 1-byte slots) with random transfer costs and host cap."""
    rng = random.Random(seed)
    stages = []
    for _ in range(length + 1):
        out = rng.randint(0, 6)
        stages.append(Stage(float(rng.randint(0, 5)), float(rng.randint(0, 5)), out, out + rng.randint(0, 6),
                            rng.choice([out, rng.randint(0, 6)]), rng.randint(0, 3), rng.randint(0, 4),
                            weight_grad_bytes=rng.choice([0, 0, rng.randint(1, 4)])))
    rate = rng.choice([0.5, 1.0, 2.0, 5.0, math.inf])
    transfer = TransferCosts(rate, rng.choice([rate, 1.0, 3.0]), rng.choice([None, None, rng.randint(0, 10)]))
    return Chain("seeded", rng.randint(0, 6), tuple(stages), transfer=transfer)


@given(chain=offload_chains(max_length=4))
@SETTINGS
def test_the_dp_is_the_best_of_its_family_at_every_budget(chain: Chain) -> None:
    for budget in _budgets(chain):
        expected, _ = offload_reference.best(chain, budget)
        assert _makespan(chain, budget) == pytest.approx(expected, abs=1e-9), budget


@pytest.mark.parametrize("seed", range(6))
def test_the_dp_is_the_best_of_its_family_on_five_stages(seed: int) -> None:
    chain = seeded_chain(seed, 5)
    budgets = list(_budgets(chain))
    offloaded = 0
    for budget in budgets[::3]:
        expected, _ = offload_reference.best(chain, budget)
        assert _makespan(chain, budget) == pytest.approx(expected, abs=1e-9), budget
        if expected < math.inf:
            offloaded += solve(chain, budget, "offload").has_transfers
    if chain.transfer_costs.usable and seed in (1, 2):
        assert offloaded > 0  # the comparison covers schedules that do offload


@given(chain=offload_chains(max_length=5))
@SETTINGS
def test_the_table_value_is_the_simulated_makespan(chain: Chain) -> None:
    top = store_all_peak_bytes(chain)
    table = offload.compute_table(chain, top, slots=max(top, 1))  # 1-byte slots
    root = table.value[1][0, table.costs.host_slots]
    for budget in range(int(chain.input_bytes), top):
        m = offload.root_slots(table, budget)
        if m < 0 or not np.isfinite(root[m]):
            continue
        ops = offload.rebuild(table, budget)
        peak, makespan, host = predict_with_host(chain, ops)
        assert makespan == pytest.approx(root[m], abs=1e-9)
        assert peak <= budget
        cap = chain.transfer_costs.host_cap_bytes
        assert cap is None or host <= cap


@given(chain=offload_chains(max_length=5))
@SETTINGS
def test_budget_and_host_cap_are_kept_and_time_never_rises(chain: Chain) -> None:
    lowest, top = min_feasible_budget(chain, "offload"), store_all_budget(chain)
    times = []
    for budget in range(lowest, top + 2):
        schedule = solve(chain, budget, "offload")
        prediction = simulate(chain, schedule)
        assert prediction.peak_bytes <= budget
        assert prediction.host_peak_bytes == schedule.predicted_host_peak_bytes
        cap = chain.transfer_costs.host_cap_bytes
        assert cap is None or prediction.host_peak_bytes <= cap
        times.append(schedule.predicted_makespan_ms)
    assert all(later <= earlier + 1e-9 for earlier, later in zip(times, times[1:]))
    with pytest.raises(InfeasibleBudgetError, match=f"minimum feasible budget for offload.*: {lowest} bytes") as info:
        solve(chain, lowest - 1, "offload")
    assert info.value.min_feasible_bytes == lowest


@given(chain=offload_chains(max_length=5))
@SETTINGS
def test_never_slower_than_rotor_and_free_transfers_never_slower(chain: Chain) -> None:
    free = chain.with_transfer(TransferCosts(math.inf, math.inf, None))
    assert min_feasible_budget(chain, "offload") <= min_feasible_budget(chain, "rotor")
    for budget in range(min_feasible_budget(chain, "rotor"), store_all_budget(chain) + 1):
        rotor = _makespan(chain, budget, "rotor")
        assert _makespan(chain, budget) <= rotor + 1e-9
        assert _makespan(free, budget) <= _makespan(chain, budget) + 1e-9


@given(chain=offload_chains(max_length=5), link=st.sampled_from(["no link out", "no link in", "no host"]))
@SETTINGS
def test_without_a_usable_link_it_is_rotor(chain: Chain, link: str) -> None:
    rates = {"no link out": (0.0, 1.0, None), "no link in": (1.0, 0.0, None), "no host": (1.0, 1.0, 0)}[link]
    cut = chain.with_transfer(TransferCosts(*rates))
    assert min_feasible_budget(cut, "offload") == min_feasible_budget(cut, "rotor")
    for budget in range(min_feasible_budget(cut, "rotor"), store_all_budget(cut) + 1):
        assert solve(cut, budget, "offload").ops == solve(cut, budget, "rotor").ops


@given(chain=offload_chains(max_length=4), factor=st.sampled_from([2.0, 10.0]))
@SETTINGS
def test_a_faster_link_is_never_slower(chain: Chain, factor: float) -> None:
    slow = chain.transfer_costs
    fast = chain.with_transfer(replace(slow, d2h_bytes_per_ms=slow.d2h_bytes_per_ms * factor,
                                       h2d_bytes_per_ms=slow.h2d_bytes_per_ms * factor))
    for budget in _budgets(chain):
        assert _makespan(fast, budget) <= _makespan(chain, budget) + 1e-9


def test_a_tiny_bandwidth_gives_rotors_schedules() -> None:
    chain = random_chain(seed=3, length=8).with_transfer(TransferCosts.from_gbps(1e-6, 1e-6))
    for budget in (min_feasible_budget(chain, "rotor"), (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2):
        assert solve(chain, budget, "offload").ops == solve(chain, budget, "rotor").ops


def test_offloading_saves_time_on_a_chain_with_large_saved_activations() -> None:
    # Each stage records four times its output; copies take half of a forward: the DP offloads and beats rotor.
    stages = tuple(Stage(2.0, 4.0, 10, 40, 10) for _ in range(6)) + (Stage(0.1, 0.1, 1, 1, 1),)
    chain = Chain("wide", 10, stages, transfer=TransferCosts(30.0, 30.0, None))
    budget = (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2
    schedule = solve(chain, budget, "offload")
    assert schedule.params.offloaded and schedule.has_transfers
    assert schedule.predicted_makespan_ms < solve(chain, budget, "rotor").predicted_makespan_ms
    assert schedule.predicted_host_peak_bytes == 30 * len(schedule.params.offloaded)
    kinds = [op.kind for op in schedule.ops]
    assert kinds.count(OpKind.OFFLOAD) == kinds.count(OpKind.PREFETCH)


def test_the_floor_is_the_minimum_on_one_byte_slots() -> None:
    for seed in range(8):
        chain = replace(seeded_chain(seed, 4), transfer=TransferCosts(1.0, 1.0, None))
        assert offload.floor_bytes(chain) == min_feasible_budget(chain, "offload")


def test_a_host_cap_limits_what_is_offloaded() -> None:
    stages = tuple(Stage(2.0, 4.0, 10, 40, 10) for _ in range(6)) + (Stage(0.1, 0.1, 1, 1, 1),)
    chain = Chain("wide", 10, stages, transfer=TransferCosts(30.0, 30.0, 65))
    budget = (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2
    schedule = solve(chain, budget, "offload")
    assert len(schedule.params.offloaded) == 2  # 30 bytes each: two fit under 65
    assert schedule.predicted_host_peak_bytes == 60
