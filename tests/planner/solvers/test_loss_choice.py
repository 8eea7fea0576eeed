"""The loss stage's chunked options: one rule in the simulator, chosen by the selective DP, optimal by search."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ChainError, InfeasibleBudgetError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.stage_option import StageOption, option_from_dict
from planner.simulation.simulator import simulate
from planner.solvers import exact, loss_choice, selective
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.store_all import store_all_ops
from tests.planner.chain_strategies import option_chains, random_chain

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def loss_option_chains(draw: st.DrawFn, max_length: int = 4, max_size: int = 6, max_options: int = 2) -> Chain:
    """:func:`option_chains` whose loss stage is large and offers 1..3 chunked options besides its others."""
    chain = draw(option_chains(max_length=max_length, max_size=max_size, max_options=max_options))
    loss = chain.stages[-1]
    loss = replace(loss, saved_bytes=loss.saved_bytes + draw(st.integers(0, 3 * max_size)))
    chunked = tuple(
        StageOption(name=f"chunks={k + 2}", saved_bytes=draw(st.integers(loss.output_bytes, loss.saved_bytes)),
                    recompute_ms=float(draw(st.integers(0, 5))), chunks=k + 2,
                    forward_overhead_bytes=draw(st.integers(0, 3)), backward_overhead_bytes=draw(st.integers(0, 4)))
        for k in range(draw(st.integers(1, 3))))
    kept = tuple(o for o in loss.options if loss.output_bytes <= o.saved_bytes <= loss.saved_bytes)
    return replace(chain, stages=(*chain.stages[:-1], replace(loss, options=kept + chunked)))


def test_option_fields_round_trip_and_validate() -> None:
    option = StageOption(name="chunks=8", saved_bytes=3, recompute_ms=1.5, chunks=8, forward_overhead_bytes=7,
                         backward_overhead_bytes=9)
    assert option_from_dict(option.to_dict(), "loss") == option
    plain = StageOption(name="o1", saved_bytes=3, recompute_ms=1.0)
    assert set(plain.to_dict()) == {"name", "saved_bytes", "recompute_ms", "recompute_flops", "saves", "save_ops",
                                    "save_occurrences"}  # a selective option's JSON is unchanged
    with pytest.raises(ChainError, match="chunks"):
        StageOption(name="x", saved_bytes=3, recompute_ms=1.0, chunks=-1)
    with pytest.raises(ChainError, match="keeps no ops"):
        StageOption(name="x", saved_bytes=3, recompute_ms=1.0, chunks=2, saves=(1,))


def test_only_the_loss_stage_may_chunk() -> None:
    chain = random_chain(seed=1, length=3)
    first = chain.stages[0]
    option = StageOption(name="chunks=2", saved_bytes=first.output_bytes, recompute_ms=1.0, chunks=2)
    with pytest.raises(ChainError, match="only the loss stage"):
        replace(chain, stages=(replace(first, options=(option,)), *chain.stages[1:]))


@given(chain=loss_option_chains())
@settings(SLOW, max_examples=60)
def test_the_simulator_prices_an_option_as_its_variant(chain: Chain) -> None:
    """F_all(L+1)[k] on the chain == F_all(L+1) on the chain whose loss stage is option k's costs."""
    top = chain.length + 1
    for option in loss_choice.chunk_choices(chain):
        base = store_all_ops(chain)
        ours = simulate(chain, loss_choice.with_loss_option(base, top, option))
        theirs = simulate(loss_choice.variant(chain, option), base)
        assert ours.peak_bytes == theirs.peak_bytes
        assert ours.makespan_ms == pytest.approx(theirs.makespan_ms)
        assert [p.peak_bytes for p in ours.timeline] == [p.peak_bytes for p in theirs.timeline]
        assert [p.memory_bytes for p in ours.timeline] == [p.memory_bytes for p in theirs.timeline]


def test_a_chunked_loss_regrows_nothing_before_its_backward() -> None:
    """By hand: the loss keeps 10 bytes instead of 100; F_all(2)[1] peaks at held + 10 + o_f 3; B(2) at held +
    10 + delta^1 + o_b 5 (a selective option would first regrow the 90 bytes it dropped)."""
    chain = random_chain(seed=3, length=1, unit_bytes=1)
    loss = replace(chain.stages[-1], saved_bytes=100, output_bytes=0, grad_bytes=0, forward_overhead_bytes=0,
                   backward_overhead_bytes=50, weight_grad_bytes=0)
    chunked = StageOption(name="chunks=4", saved_bytes=10, recompute_ms=2.0, chunks=4, forward_overhead_bytes=3,
                          backward_overhead_bytes=5)
    chain = replace(chain, stages=(chain.stages[0], replace(loss, options=(chunked,))))
    ops = (Op(OpKind.F_ALL, 1), Op(OpKind.F_ALL, 2, 1), Op(OpKind.B, 2), Op(OpKind.B, 1))
    held = chain.input_bytes + chain.stages[0].saved_bytes
    found = simulate(chain, ops).timeline
    assert found[1].peak_bytes == held + 10 + 3
    assert found[2].peak_bytes == held + 10 + chain.delta(1) + 5
    assert found[2].memory_bytes == held + chain.delta(1)
    plain = simulate(chain, store_all_ops(chain))
    assert plain.timeline[2].peak_bytes == held + 100 + chain.delta(1) + 50
    assert simulate(chain, ops).makespan_ms == pytest.approx(plain.makespan_ms + 2.0)


@pytest.mark.slow
@given(chain=loss_option_chains(max_length=3, max_size=4))
@settings(SLOW, max_examples=30)
def test_selective_with_loss_options_is_the_optimum_of_the_search(chain: Chain) -> None:
    """The DP over the loss's options == exhaustive search over every persistent sequence and option."""
    lowest = exact.min_budget_bytes(chain, persistent=True)
    top = store_all_budget(chain)
    slots = max(top, 1)  # one-byte slots at every budget: the DP is exact
    assert selective.min_budget_bytes(chain, slots) == lowest
    for budget in range(lowest, top + 1):
        best = exact.search(chain, budget, persistent=True)
        assert best is not None
        found = selective.plan(chain, budget, slots)
        prediction = simulate(chain, found.ops)
        assert prediction.peak_bytes <= budget
        assert prediction.makespan_ms == pytest.approx(best.makespan_ms, abs=1e-4)
    if lowest > 0:
        with pytest.raises(InfeasibleBudgetError):
            selective.plan(chain, lowest - 1, slots)


def _big_loss(seed: int = 5, length: int = 8) -> tuple[Chain, Chain]:
    """A random chain whose loss keeps 400 MiB more (its logits), without and with chunked options."""
    chain = random_chain(seed=seed, length=length)
    loss = chain.stages[-1]
    big = replace(loss, saved_bytes=loss.saved_bytes + 400 * 2**20, backward_overhead_bytes=200 * 2**20)
    options = tuple(
        StageOption(name=f"chunks={k}", saved_bytes=loss.saved_bytes, recompute_ms=5.0 + k * 0.05, chunks=k,
                    forward_overhead_bytes=400 * 2**20 // k, backward_overhead_bytes=400 * 2**20 // k)
        for k in (2, 8, 32))
    eager = StageOption(name="chunks=8 eager", saved_bytes=loss.saved_bytes + chain.delta(length) + 10 * 2**20,
                        recompute_ms=0.4, chunks=8, eager=True, forward_overhead_bytes=50 * 2**20,
                        backward_overhead_bytes=0)
    big = replace(big, weight_grad_bytes=10 * 2**20)
    plain = replace(chain, stages=(*chain.stages[:-1], big))
    return plain, replace(chain, stages=(*chain.stages[:-1], replace(big, options=(*options, eager))))


def test_chunks_lower_the_minimum_budget_and_solve_picks_them_only_when_needed() -> None:
    plain, with_options = _big_loss()
    top = plain.length + 1
    assert min_feasible_budget(with_options, "selective") < min_feasible_budget(plain, "selective")
    assert min_feasible_budget(plain, "selective") == min_feasible_budget(plain, "rotor")
    lowest = min_feasible_budget(with_options, "selective")
    low = solve(with_options, lowest, "selective")
    assert any(op.stage == top and op.option for op in low.ops)
    assert low.predicted_peak_bytes is not None and low.predicted_peak_bytes <= lowest
    high = solve(with_options, store_all_budget(with_options), "selective")
    assert not any(op.option for op in high.ops)  # enough memory: the loss runs as written (faster)
    assert np.isfinite(low.predicted_makespan_ms or np.inf)
    # rotor keeps the loss as written, whatever it offers
    assert min_feasible_budget(with_options, "rotor") == min_feasible_budget(plain, "rotor")


def test_the_selective_front_is_the_envelope_over_the_loss_options() -> None:
    from planner.fronts.pareto import pareto_front

    plain, with_options = _big_loss(seed=6, length=6)
    front, before = pareto_front(with_options, "selective", 100), pareto_front(plain, "selective", 100)
    assert front.min_feasible_bytes < before.min_feasible_bytes
    for budget, makespan in zip(front.budgets_bytes, front.makespans_ms, strict=True):
        schedule = front.schedule_at(int(budget))
        prediction = simulate(with_options, schedule.ops)
        assert prediction.peak_bytes <= budget
        assert prediction.makespan_ms == pytest.approx(makespan)
        assert makespan <= before.makespan_at(int(budget)) * (1 + 1e-6) if budget >= before.min_feasible_bytes \
            else True
    assert any(op.option for op in front.schedule_at(front.min_feasible_bytes).ops if op.stage == plain.length + 1)


def test_held_counts_the_loss_and_chooses_its_option() -> None:
    from planner.solvers import held

    plain, with_options = _big_loss(seed=7, length=5)
    assert held.store_all_held_bytes(with_options) == held.store_all_held_bytes(plain) + plain.stages[-1].saved_bytes
    lightest = min(option.saved_bytes for option in with_options.stages[-1].options)
    budget = held.store_all_held_bytes(plain) + lightest + 2**20  # the blocks, a chunked loss (and slots)
    found = held.plan(with_options, budget)
    assert found.params.options is not None and found.params.options[-1] > 0
    loss = with_options.stages[-1].options[found.params.options[-1] - 1]
    assert loss.chunks and found.params.held_bytes is not None and found.params.held_bytes <= budget
    assert any(op.stage == plain.length + 1 and op.option for op in found.ops)
    simulate(with_options, found.ops)  # a valid schedule


@given(chain=loss_option_chains())
@settings(SLOW, max_examples=60)
def test_the_minimum_solves_only_undominated_variants_and_loses_nothing(chain: Chain) -> None:
    """``min_budget_bytes`` skips the variants another holds less than in every respect: the same minimum as
    solving every variant, with fewer solves."""
    solved: list[Chain] = []

    def rotor_min(fixed: Chain) -> int:
        solved.append(fixed)
        return min_feasible_budget(fixed, "rotor")

    every = min(min_feasible_budget(loss_choice.variant(chain, k), "rotor") for k in loss_choice.chunk_choices(chain))
    assert loss_choice.min_budget_bytes(chain, rotor_min) == every
    assert 1 <= len(solved) <= len(loss_choice.chunk_choices(chain))
