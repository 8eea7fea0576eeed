"""The Pareto front from one DP solve, schedules read from it, and every algorithm's points.

Chains with step costs (built from a trace) speak whole-step bytes; the same table answers both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings

from memprof.units import format_bytes
from planner import (
    Chain,
    InfeasibleBudgetError,
    Stage,
    UnknownAlgorithmError,
    algorithm_points,
    pareto_front,
    simulate,
    solve,
)
from planner.fronts.points import POINT_COLUMNS
from planner.model.step import StepCosts
from planner.solvers import rotor_fill, sqrt
from planner.solvers.dispatch import min_feasible_budget, store_all_budget
from tests.planner.chain_strategies import MIB, option_chains, random_chain, random_option_chain, toy_chain


def test_toy_front() -> None:
    chain = toy_chain()
    front = pareto_front(chain)
    assert front.min_feasible_bytes == front.budgets_bytes[0] == min_feasible_budget(chain, "rotor")
    assert front.max_budget_bytes == store_all_budget(chain) == front.budgets_bytes[-1]
    assert (np.diff(front.budgets_bytes) > 0).all() and (np.diff(front.makespans_ms) < 0).all()
    assert front.makespans_ms[-1] == pytest.approx(37.38)
    assert front.makespan_at(90 * MIB) == pytest.approx(47.42, abs=1e-4)
    assert front.to_frame().shape == (len(front.budgets_bytes), 2)


def test_schedules_read_from_the_front_are_the_solved_ones() -> None:
    chain = random_chain(seed=6, length=25)
    front = pareto_front(chain)
    for budget, makespan in zip(front.budgets_bytes, front.makespans_ms):
        schedule = front.schedule_at(int(budget))
        assert schedule.predicted_peak_bytes <= budget
        assert schedule.predicted_makespan_ms == pytest.approx(makespan, rel=1e-5)
    for budget in (front.max_budget_bytes, int(front.max_budget_bytes * 1.1)):
        assert front.schedule_at(budget).ops == solve(chain, budget).ops  # store-all


def test_front_and_solve_are_within_one_slot_per_size_of_each_other() -> None:
    """The front reads one table on store-all's grid; solve divides each budget into its own slots.

    Either rounds each size up by less than one slot of its grid, so each is at least as fast as the other
    at a budget smaller by one slot per size the memory counts at once (at most L + 6, plus one for the
    budget's own rounding down): ``solve(B) <= front(B - n * slot(B))`` and ``front(B) <= solve(B - n *
    slot(top))``.
    """
    chain = random_chain(seed=6, length=25)
    front = pareto_front(chain)
    lowest, sizes = min_feasible_budget(chain), chain.length + 7
    top_slot = -(-front.max_budget_bytes // 500)
    for budget in np.linspace(lowest, front.max_budget_bytes, 9).astype(int)[1:]:
        solved, read = solve(chain, int(budget)), front.schedule_at(int(budget))
        assert solved.predicted_peak_bytes <= budget and read.predicted_peak_bytes <= budget
        smaller = int(budget) - sizes * solved.params.slot_bytes
        if smaller >= front.min_feasible_bytes:
            assert solved.predicted_makespan_ms <= front.schedule_at(smaller).predicted_makespan_ms + 1e-9
        smaller = int(budget) - sizes * top_slot
        if smaller >= lowest:
            assert read.predicted_makespan_ms <= solve(chain, smaller).predicted_makespan_ms + 1e-9


def test_front_is_solve_when_both_have_1_byte_slots() -> None:
    chain = Chain("ints", 3, (Stage(1.0, 2.0, 4, 6, 5, 1, 2), Stage(2.0, 1.0, 3, 4, 3, 0, 1),
                              Stage(0.5, 3.0, 5, 5, 5, 2, 0), Stage(0.0, 0.0, 1, 1, 1)))
    front = pareto_front(chain)
    assert front.table.grid.slot_bytes == 1 and front.min_feasible_bytes == min_feasible_budget(chain)
    for budget in range(front.min_feasible_bytes, front.max_budget_bytes + 2):
        assert front.schedule_at(budget).ops == solve(chain, budget).ops


def test_schedule_at_reads_the_table_without_solving(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = random_chain(seed=7, length=30)
    front = pareto_front(chain)

    def no_new_dp(*args: object, **kwargs: object) -> None:
        raise AssertionError("schedule_at must not run the DP again")

    monkeypatch.setattr(rotor_fill, "fill", no_new_dp)
    middle = (front.min_feasible_bytes + front.max_budget_bytes) // 2
    assert front.schedule_at(middle).predicted_peak_bytes <= middle
    with pytest.raises(InfeasibleBudgetError) as excinfo:
        front.schedule_at(front.min_feasible_bytes - 1)
    assert excinfo.value.min_feasible_bytes == front.min_feasible_bytes


@pytest.mark.parametrize("algorithm", ["revolve", "rotor_optimal"])
def test_other_dp_fronts(algorithm: str) -> None:
    chain = toy_chain()
    front = pareto_front(chain, algorithm)
    best = pareto_front(chain, "rotor")
    for budget in front.budgets_bytes:
        if budget < best.min_feasible_bytes:
            continue
        if algorithm == "revolve":
            assert front.makespan_at(int(budget)) >= best.makespan_at(int(budget)) - 1e-4
        else:
            assert front.makespan_at(int(budget)) <= best.makespan_at(int(budget)) + 1e-4


def test_only_dp_algorithms_have_a_front() -> None:
    with pytest.raises(UnknownAlgorithmError, match="expected one of rotor, revolve, rotor_optimal, selective, found 'sqrt'"):
        pareto_front(toy_chain(), "sqrt")


def test_algorithm_points() -> None:
    chain = toy_chain()
    points = algorithm_points(chain, sweep=6)
    assert tuple(points.columns) == POINT_COLUMNS
    counts = points["algorithm"].value_counts().to_dict()
    assert counts["store_all"] == counts["sqrt"] == 1
    assert counts["periodic"] == chain.length - 1 and counts["rotor"] <= 6 and counts["revolve"] <= 6
    binomial_rows = points[points["algorithm"] == "binomial"]
    snapshots = [json.loads(p)["snapshots"] for p in binomial_rows["params"]]
    assert snapshots == sorted(set(snapshots)) and snapshots[0] == 1 and snapshots[-1] == chain.length
    # more snapshots: more memory bound and no more forwards, so never slower
    assert binomial_rows["budget_bytes"].is_monotonic_increasing
    assert (points["peak_bytes"] <= points["budget_bytes"]).all()
    store_all_row = points[points["algorithm"] == "store_all"].iloc[0]
    assert store_all_row["peak_bytes"] == store_all_budget(chain) and store_all_row["makespan_ms"] == pytest.approx(37.38)
    assert sorted(json.loads(p)["segments"] for p in points[points["algorithm"] == "periodic"]["params"]) == [2, 3, 4, 5, 6]
    rotor_rows = points[points["algorithm"] == "rotor"]
    front = pareto_front(chain)  # the points are the slider's, read from store-all's grid
    for _, row in rotor_rows.iterrows():
        assert row["makespan_ms"] == pytest.approx(simulate(chain, front.schedule_at(row["budget_bytes"]).ops).makespan_ms)


def test_revolve_front_may_start_at_store_alls_peak() -> None:
    # one stage: revolve's only schedule, F_ck(1) F_all(2) B(2) F_all(1) B(1), peaks exactly where store-all does
    chain = Chain("one", 8, (Stage(1.0, 2.0, 4, 6, 4, 1, 3), Stage(0.0, 0.0, 0, 0, 0)))
    front = pareto_front(chain, "revolve")
    assert front.budgets_bytes.tolist() == [store_all_budget(chain)] == [29]
    assert front.makespans_ms.tolist() == [4.0]
    assert front.schedule_at(29).predicted_makespan_ms == 4.0


def _with_step(chain: Chain, floor_bytes: int, base_bytes: int = 50 * MIB) -> Chain:
    """``chain`` inside a training step holding ``base_bytes`` beside it, whose optimizer step peaks at
    ``floor_bytes``."""
    return chain.with_step(StepCosts(
        model_state_bytes=base_bytes - 10 * MIB, inputs_bytes=2 * MIB, outside_bytes=8 * MIB,
        before_peak_bytes=base_bytes + MIB, after_peak_bytes=floor_bytes, optimizer_step_bytes=3 * MIB,
        optimizer_peak_bytes=floor_bytes,
    ))


def test_step_front_is_the_chain_front_shifted_and_clipped_at_the_floor() -> None:
    # The toy chain's optima sit at about 82.4, 87.3, 92.0, 97.0, 98.0 and 107.0 MiB (chain only); 50 MiB
    # beside the chain and an optimizer step peaking at 143 MiB fold the first three into one at 143 MiB.
    plain = toy_chain()
    chain = _with_step(plain, floor_bytes=143 * MIB)
    base, floor = chain.step.base_bytes, chain.step.floor_bytes
    alone, front = pareto_front(plain), pareto_front(chain)
    expected = sorted({max(floor, int(b) + base) for b in alone.budgets_bytes})
    assert front.budgets_bytes.tolist() == expected and len(expected) == len(alone.budgets_bytes) - 2
    assert front.budgets_bytes[0] == floor
    for budget, makespan in zip(front.budgets_bytes, front.makespans_ms):
        assert makespan == alone.makespan_at(int(budget) - base)
    assert front.min_feasible_bytes == min_feasible_budget(chain) == floor
    assert front.max_budget_bytes == store_all_budget(chain) == alone.max_budget_bytes + base
    assert front.makespan_at(front.max_budget_bytes) == pytest.approx(37.38)
    assert front.step is chain.step and front.chain_budget_bytes(200 * MIB) == 150 * MIB
    assert pareto_front(plain).budgets_bytes.tolist() == alone.budgets_bytes.tolist()  # chain-only unchanged


@pytest.mark.parametrize("clipped", [False, True])
def test_step_schedules_read_from_the_front_are_the_solved_ones(clipped: bool) -> None:
    plain = random_chain(seed=6, length=25)
    alone = pareto_front(plain)
    # the floor either below every optimum, or half-way up the front (the lower half folds into one)
    floor = 60 * MIB if not clipped else 50 * MIB + int(alone.budgets_bytes[len(alone.budgets_bytes) // 2]) + 1
    chain = _with_step(plain, floor_bytes=floor)
    step = chain.step
    front = pareto_front(chain)
    assert (len(front.budgets_bytes) < len(alone.budgets_bytes)) == clipped
    for budget in np.linspace(front.min_feasible_bytes, front.max_budget_bytes * 1.1, 9).astype(int):
        read, solved = front.schedule_at(int(budget)), solve(chain, int(budget))
        # solve divides the budget itself into slots, the front store-all's peak: close, not always equal
        if budget >= front.max_budget_bytes:
            assert read.ops == solved.ops
        assert solved.predicted_makespan_ms <= read.predicted_makespan_ms * 1.01
        assert read.budget_bytes == solved.budget_bytes == int(budget)
        assert read.predicted_peak_bytes == simulate(chain, read.ops).peak_bytes
        assert solved.predicted_step_peak_bytes == step.step_peak_bytes(solved.predicted_peak_bytes) <= budget
        assert read.predicted_step_peak_bytes == step.step_peak_bytes(read.predicted_peak_bytes) <= budget
        assert read.predicted_makespan_ms == pytest.approx(front.makespan_at(int(budget)), rel=1e-5)
    assert pareto_front(chain.activations_only()).schedule_at(front.min_feasible_bytes).predicted_step_peak_bytes is None


def test_step_budget_below_the_floor_names_the_minimum_and_what_dominates() -> None:
    chain = _with_step(toy_chain(), floor_bytes=143 * MIB)
    front = pareto_front(chain)
    for ask in (front.schedule_at, front.makespan_at):
        with pytest.raises(InfeasibleBudgetError) as excinfo:
            ask(front.min_feasible_bytes - 1)
        assert excinfo.value.min_feasible_bytes == front.min_feasible_bytes
        message = str(excinfo.value)
        assert chain.step.explain_floor() in message and "the optimizer step needs 3.0 MiB" in message
        assert f"the smallest budget for rotor is {format_bytes(front.min_feasible_bytes)}" in message
    # A floor below what the chain itself needs: the chain dominates, and the message says what surrounds it.
    low = _with_step(toy_chain(), floor_bytes=100 * MIB)
    front = pareto_front(low)
    assert front.min_feasible_bytes == min_feasible_budget(low) > low.step.floor_bytes
    with pytest.raises(InfeasibleBudgetError, match="for the whole step is too small for rotor") as excinfo:
        front.schedule_at(front.min_feasible_bytes - 1)
    assert excinfo.value.min_feasible_bytes == front.min_feasible_bytes
    assert format_bytes(low.step.base_bytes) + " besides the chain" in str(excinfo.value)
    with pytest.raises(InfeasibleBudgetError, match="is below what the training step needs outside the chain"):
        front.schedule_at(99 * MIB)


def test_algorithm_points_of_a_step_chain_are_whole_step() -> None:
    plain = toy_chain()
    chain = _with_step(plain, floor_bytes=95 * MIB + 50 * MIB)
    step = chain.step
    alone, points = algorithm_points(plain, sweep=6), algorithm_points(chain, sweep=6)
    assert tuple(points.columns) == POINT_COLUMNS
    assert (points["peak_bytes"] <= points["budget_bytes"]).all()
    assert (points["peak_bytes"] >= step.floor_bytes).all()
    store_all_row = points[points["algorithm"] == "store_all"].iloc[0]
    assert store_all_row["peak_bytes"] == store_all_row["budget_bytes"] == store_all_budget(chain)
    fixed = ["store_all", "periodic", "sqrt"]  # no budget: the same schedules, their peaks in step terms
    mine = points[points["algorithm"].isin(fixed)].reset_index(drop=True)
    theirs = alone[alone["algorithm"].isin(fixed)].reset_index(drop=True)
    assert mine["peak_bytes"].tolist() == [step.step_peak_bytes(p) for p in theirs["peak_bytes"]]
    assert mine["makespan_ms"].tolist() == theirs["makespan_ms"].tolist()
    front = pareto_front(chain)
    rotor_rows = points[points["algorithm"] == "rotor"]
    assert rotor_rows["budget_bytes"].min() == front.min_feasible_bytes
    assert rotor_rows["budget_bytes"].max() == front.max_budget_bytes
    for _, row in rotor_rows.iterrows():
        solved = solve(chain, int(row["budget_bytes"]))
        assert row["peak_bytes"] == solved.predicted_step_peak_bytes
        assert row["makespan_ms"] == pytest.approx(solved.predicted_makespan_ms)


def test_algorithm_points_include_offload_when_it_can_help() -> None:
    from planner.fronts.points import OFFLOAD_POINTS_MAX_STAGES
    from planner.model.chain import Chain, Stage
    from planner.model.transfer import TransferCosts

    wide = Chain("wide", 10, tuple(Stage(2.0, 4.0, 10, 40, 10) for _ in range(6)) + (Stage(0.1, 0.1, 1, 1, 1),),
                 transfer=TransferCosts(30.0, 30.0, None))
    points = algorithm_points(wide, sweep=6)
    rows = points[points["algorithm"] == "offload"]
    assert 1 <= len(rows) <= 6 and (rows["peak_bytes"] <= rows["budget_bytes"]).all()
    hosts = [json.loads(p)["host_peak_bytes"] for p in rows["params"]]
    assert max(hosts) > 0
    rotor_rows = points[points["algorithm"] == "rotor"]
    assert rows["peak_bytes"].min() <= rotor_rows["peak_bytes"].min()
    longer = Chain("long", 10, tuple(Stage(2.0, 4.0, 10, 40, 10) for _ in range(OFFLOAD_POINTS_MAX_STAGES + 1))
                   + (Stage(0.1, 0.1, 1, 1, 1),))
    assert "offload" not in set(algorithm_points(longer, sweep=2)["algorithm"])  # its table would take seconds


def test_selective_front_reads_the_solved_schedules_and_never_loses_to_rotor() -> None:
    chain = random_option_chain(seed=3, length=8, options=2)
    front = pareto_front(chain, "selective")
    rotor_front = pareto_front(chain, "rotor")
    assert front.algorithm == "selective" and front.max_budget_bytes == rotor_front.max_budget_bytes
    assert front.min_feasible_bytes <= rotor_front.min_feasible_bytes  # options keep less than F_all
    assert front.min_feasible_bytes == pytest.approx(min_feasible_budget(chain, "selective"), rel=0.01)
    with_options = 0
    for budget in np.linspace(front.min_feasible_bytes, front.max_budget_bytes, 9).astype(np.int64):
        schedule = front.schedule_at(int(budget))
        assert schedule.algorithm == "selective" and schedule.predicted_peak_bytes <= budget
        with_options += any(op.option for op in schedule.ops)
        if budget >= rotor_front.min_feasible_bytes:
            assert schedule.predicted_makespan_ms <= rotor_front.schedule_at(int(budget)).predicted_makespan_ms + 1e-3
    assert with_options > 0  # the tight budgets pick options


@settings(max_examples=40, deadline=None)
@given(option_chains(max_length=4, max_size=6))
def test_selective_front_is_solve_when_both_have_1_byte_slots(chain: Chain) -> None:
    # sizes of at most 6 bytes with DEFAULT_SLOTS slots: both grids are exact, so both give the optimum
    front = pareto_front(chain, "selective")
    assert front.table.grid.slot_bytes == 1
    assert front.min_feasible_bytes == min_feasible_budget(chain, "selective")
    for budget in range(front.min_feasible_bytes, front.max_budget_bytes + 2):
        from_front, solved = front.schedule_at(budget), solve(chain, budget, "selective")
        assert from_front.predicted_peak_bytes <= budget
        assert from_front.predicted_makespan_ms == pytest.approx(solved.predicted_makespan_ms, abs=1e-4)


def test_algorithm_points_add_selective_only_when_a_stage_has_options() -> None:
    assert "selective" not in set(algorithm_points(toy_chain(), sweep=4)["algorithm"])
    chain = random_option_chain(seed=3, length=8, options=2)
    points = algorithm_points(chain, sweep=5)
    rows = points[points["algorithm"] == "selective"]
    assert 1 <= len(rows) <= 5
    front = pareto_front(chain, "selective")
    assert rows["budget_bytes"].min() == front.min_feasible_bytes
    for _, row in rows.iterrows():
        schedule = front.schedule_at(int(row["budget_bytes"]))
        assert row["peak_bytes"] == schedule.predicted_peak_bytes <= row["budget_bytes"]
        assert row["makespan_ms"] == pytest.approx(schedule.predicted_makespan_ms)
    # at its tightest budget selective goes below what rotor can reach
    assert rows["peak_bytes"].min() <= points[points["algorithm"] == "rotor"]["peak_bytes"].min()


def _skips_chain() -> Chain:
    """Six stages whose first two outputs are read again by stages 5 and 4 (a U-Net's skips)."""
    from planner.solvers.carried_fit import Carried

    stages = tuple(Stage(1.0 + i, 2.0, 100, 300, 100, name=f"s{i}") for i in range(6)) + (Stage(0.0, 0.0, 0, 0, 0),)
    return Chain("skips", 100, stages, carried=(Carried(1, (5,), 400, "s0"), Carried(2, (4,), 200, "s1")))


@pytest.mark.parametrize("algorithm", ["rotor", "selective", "revolve"])
def test_front_of_a_chain_with_skips_counts_their_memory(algorithm: str) -> None:
    from planner.solvers.carried_fit import peak_bytes

    chain = _skips_chain()
    front = pareto_front(chain, algorithm, slots=200)
    assert front.max_budget_bytes == front.budgets_bytes[-1]
    if algorithm != "revolve":  # revolve reads its own table at store-all's peak, not store-all
        assert front.max_budget_bytes == store_all_budget(chain)
    assert (np.diff(front.budgets_bytes) > 0).all() and (np.diff(front.makespans_ms) < 0).all()
    alone = Chain(chain.name, chain.input_bytes, chain.stages)  # the same chain without its skips
    without = [simulate(alone, ops).peak_bytes for ops in front.plans]
    assert any(peak_bytes(chain, ops) > bare for ops, bare in zip(front.plans, without))  # the skips matter
    for budget, makespan in zip(front.budgets_bytes, front.makespans_ms):
        for asked in (int(budget), int(budget) + 50):
            schedule = front.schedule_at(asked)
            assert schedule.predicted_peak_bytes == peak_bytes(chain, schedule.ops) <= asked
            assert schedule.predicted_makespan_ms == pytest.approx(makespan)
    with pytest.raises(InfeasibleBudgetError, match=str(front.min_feasible_bytes)):
        front.schedule_at(front.min_feasible_bytes - 1)


def test_algorithm_points_of_a_chain_with_skips_count_them() -> None:
    from planner.solvers.carried_fit import peak_bytes

    chain = _skips_chain()
    points = algorithm_points(chain, sweep=4)
    store_all_row = points[points["algorithm"] == "store_all"].iloc[0]
    assert store_all_row["peak_bytes"] == store_all_budget(chain)
    for row in points[points["algorithm"] == "rotor"].itertuples():
        assert row.peak_bytes <= row.budget_bytes
    sqrt_ops = sqrt.sqrt_ops(chain)
    assert points[points["algorithm"] == "sqrt"].iloc[0]["peak_bytes"] == peak_bytes(chain, sqrt_ops)
    alone = Chain(chain.name, chain.input_bytes, chain.stages)  # without its skips
    assert peak_bytes(chain, sqrt_ops) > simulate(alone, sqrt_ops).peak_bytes  # sqrt drops a skip's producer


@pytest.mark.parametrize("algorithm", ["rotor", "revolve", "selective"])
def test_the_front_starts_where_solve_says_the_minimum_is(algorithm: str) -> None:
    # store-all's grid rounds each size up by up to a slot of store-all's peak / 500; the minimum's own grid
    # by a slot of the minimum / 500, so the table alone started higher than min_feasible_budget
    chain = random_chain(seed=7, length=30) if algorithm != "selective" else random_option_chain(3, 12, 2)
    front = pareto_front(chain, algorithm)
    lowest = min_feasible_budget(chain, algorithm)
    assert front.min_feasible_bytes == lowest
    schedule = front.schedule_at(lowest)
    assert schedule.predicted_peak_bytes <= lowest
    assert schedule.predicted_makespan_ms == pytest.approx(solve(chain, lowest, algorithm).predicted_makespan_ms)
    assert (np.diff(front.budgets_bytes) > 0).all() and (np.diff(front.makespans_ms) < 0).all()
    with pytest.raises(InfeasibleBudgetError):
        front.schedule_at(lowest - 1)
