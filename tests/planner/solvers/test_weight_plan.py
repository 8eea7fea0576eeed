"""Choosing the streamed stages: the fast nested search against every subset, and its properties (budget
kept, the minimum named and reachable, nothing streamed when it is not needed)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ChainError, InfeasibleBudgetError
from planner.model.chain import Chain, Stage
from planner.model.step import StepCosts
from planner.model.transfer import TransferCosts
from planner.model.weights import WeightCosts
from planner.simulation.simulator import simulate
from planner.solvers import offload, rotor, weight_plan
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.reference import weight_plan as weight_plan_reference
from tests.planner.chain_strategies import small_chains

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_weights(chain: Chain, params: list[int], states: list[int], gbps: float, rest: int = 3) -> Chain:
    """``chain`` with weight costs and a whole step whose model state holds them (plus ``rest`` bytes)."""
    weights = WeightCosts(tuple(params), tuple(params), tuple(states))
    resident = sum(params) + sum(states)
    step = StepCosts(model_state_bytes=resident + rest, inputs_bytes=2, outside_bytes=1,
                     before_peak_bytes=resident + rest + 3, after_peak_bytes=resident + rest + sum(params) + 2,
                     weights_bytes=sum(params) + rest, optimizer_state_bytes=sum(states),
                     weight_grad_bytes=sum(params))
    link = TransferCosts(gbps, gbps, None)
    return Chain(chain.name, chain.input_bytes, chain.stages, step=step, transfer=link, weights=weights)


def seeded(seed: int, length: int) -> Chain:
    rng = random.Random(seed)
    stages = []
    for index in range(length + 1):
        output = rng.randint(1, 6)
        stages.append(Stage(float(rng.randint(1, 5)), float(rng.randint(1, 8)), output, output + rng.randint(0, 3),
                            output, rng.randint(0, 2), rng.randint(0, 3), name=f"s{index + 1}"))
    chain = Chain(f"seeded{seed}", rng.randint(1, 4), tuple(stages))
    params = [rng.randint(0, 8) for _ in range(length)]
    return with_weights(chain, params, [2 * p for p in params], rng.choice([0.5, 2.0, 8.0, math.inf]))


@pytest.mark.parametrize("module", [rotor, offload], ids=["rotor", "offload"])
@pytest.mark.parametrize("seed", range(8))
def test_the_nested_search_is_never_faster_than_every_subset_and_matches_it_on_its_sets(seed: int, module) -> None:
    chain = seeded(seed, 2 + seed % 3)
    sets = set(weight_plan.nested_sets(chain))
    low, top = weight_plan_reference.best, store_all_budget(chain)
    floor = min(min_feasible_budget(chain, "rotor", stream_weights=True) - 2, top)
    for budget in sorted({floor, (floor + top) // 2, top, top + 5}):
        reference = low(chain, budget, module, 500)
        try:
            fast = weight_plan.plan(chain, budget, module, 500, "test")
        except InfeasibleBudgetError:
            fast = None
        if reference is None:
            assert fast is None
            continue
        if fast is None:  # only a set outside the nested ones fits
            assert reference.streamed not in sets
            continue
        assert fast.makespan_ms >= reference.makespan_ms - 1e-9
        assert fast.device_bytes <= budget and reference.device_bytes <= budget
        if reference.streamed in sets:
            assert fast.makespan_ms == pytest.approx(reference.makespan_ms)


@SETTINGS
@given(small_chains(max_length=4), st.data())
def test_the_budget_is_kept_and_the_minimum_is_named_and_reachable(chain: Chain, data: st.DataObject) -> None:
    length = chain.length
    params = data.draw(st.lists(st.integers(0, 6), min_size=length, max_size=length))
    gbps = data.draw(st.sampled_from([0.5, 4.0, math.inf]))
    chain = with_weights(chain, params, [2 * p for p in params], gbps)
    algorithm = data.draw(st.sampled_from(["rotor", "offload"]))
    least = min_feasible_budget(chain, algorithm, stream_weights=True)
    schedule = solve(chain, least, algorithm, stream_weights=True)
    assert schedule.predicted_step_peak_bytes is not None and schedule.predicted_step_peak_bytes <= least
    budget = data.draw(st.integers(0, store_all_budget(chain) + 4))
    try:
        schedule = solve(chain, budget, algorithm, stream_weights=True)
    except InfeasibleBudgetError as exc:
        assert budget < least and exc.min_feasible_bytes == least
        assert "weight streaming" in str(exc) and str(least) in str(exc)
        return
    assert schedule.predicted_step_peak_bytes <= budget
    replayed = simulate(chain, schedule)  # the schedule carries its streamed stages
    assert replayed.peak_bytes == schedule.predicted_peak_bytes
    assert replayed.makespan_ms == schedule.predicted_makespan_ms
    assert set(schedule.params.streamed_weights) <= set(range(1, length + 1))


def test_streaming_lowers_the_minimum_and_is_not_used_where_the_budget_needs_none() -> None:
    chain = seeded(3, 4)
    rotor_least = min_feasible_budget(chain, "rotor")
    least = min_feasible_budget(chain, "rotor", stream_weights=True)
    assert least < rotor_least
    assert solve(chain, least, "rotor", stream_weights=True).params.streamed_weights
    roomy = solve(chain, store_all_budget(chain) + 100, "rotor", stream_weights=True)
    assert roomy.params.streamed_weights == ()  # nothing to gain: no copies


def test_a_chain_without_weight_costs_is_refused_with_how_to_fix() -> None:
    chain = seeded(0, 2).with_weights(None)
    with pytest.raises(ChainError, match="chain_from_trace"):
        solve(chain, 10**6, "rotor", stream_weights=True)


def test_the_host_cap_bounds_streamed_state_and_offloaded_activations_together() -> None:
    chain = seeded(3, 4)
    assert chain.weights is not None
    least = min_feasible_budget(chain, "offload", stream_weights=True)
    free = solve(chain, least, "offload", stream_weights=True)
    assert len(free.streamed_weights) >= 2
    cap = chain.weights.host_bytes(free.streamed_weights[:1])  # room for one of them only
    capped = chain.with_transfer(TransferCosts(chain.transfer_costs.d2h_bytes_per_ms,
                                               chain.transfer_costs.h2d_bytes_per_ms, cap))
    for budget in (min_feasible_budget(capped, "offload", stream_weights=True), store_all_budget(capped)):
        schedule = solve(capped, budget, "offload", stream_weights=True)
        assert schedule.predicted_host_peak_bytes <= cap
        assert simulate(capped, schedule).host_peak_bytes == schedule.predicted_host_peak_bytes
    assert min_feasible_budget(capped, "offload", stream_weights=True) > least
    with pytest.raises(InfeasibleBudgetError, match="the smallest budget is"):
        solve(capped, least, "offload", stream_weights=True)
