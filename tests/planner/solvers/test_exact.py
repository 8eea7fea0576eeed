"""Exhaustive search: hand-checkable optima, the persistence restriction, the size guard."""

from __future__ import annotations

import pytest

from planner.model.chain import Chain, Stage
from planner.simulation.simulator import simulate
from planner.solvers import exact
from tests.planner.chain_strategies import MIB, random_chain, toy_chain


def one_stage_chain() -> Chain:
    # a^0 = 4; stage 1: a = 2, a-bar = 6, o_b = 1; loss: a = a-bar = delta = 1
    return Chain("one", 4, (Stage(1.0, 1.0, 2, 6, 2, 0, 1), Stage(1.0, 1.0, 1, 1, 1)))


def test_one_stage_by_hand() -> None:
    chain = one_stage_chain()
    # store-all: F_all(1) F_all(2) B(2) B(1), peak at B(1): a^0 4 + a-bar^1 6 + delta^1 2 + delta^0 4 + o_b 1 = 17
    best = exact.search(chain, 100)
    assert best.makespan_ms == 4.0 and best.peak_bytes == 17
    # F_ck(1) F_all(2) B(2) F_all(1) B(1) recomputes F^1 (5 ms) and peaks at 17 too; below 17 nothing runs
    assert exact.search(chain, 16) is None
    assert exact.min_budget_bytes(chain) == 17
    assert simulate(chain, best.ops).makespan_ms == 4.0


@pytest.mark.slow
def test_toy_90_mb_optimum_is_the_papers() -> None:
    best = exact.search(toy_chain(), 90 * MIB)
    assert best.makespan_ms == pytest.approx(47.42, abs=1e-9)
    assert simulate(toy_chain(), best.ops).peak_bytes <= 90 * MIB


def test_persistent_search_is_never_better() -> None:
    chain = random_chain(seed=11, length=3, unit_bytes=1)
    lowest = exact.min_budget_bytes(chain)
    for budget in range(lowest, lowest + 120, 7):
        free = exact.search(chain, budget)
        restricted = exact.search(chain, budget, persistent=True)
        assert free is not None
        assert restricted is None or restricted.makespan_ms >= free.makespan_ms - 1e-9


def test_refuses_long_chains() -> None:
    with pytest.raises(exact.SearchTooLargeError, match="at most 8 stages.*has 9"):
        exact.search(random_chain(seed=1, length=9), 10**12)
