"""Slow, obviously-correct reference for the weight-streaming search: every subset of stages, not L + 1 nested ones.

Each subset S of 1..L is solved as :func:`planner.solvers.weight_plan.evaluate` does (the activation schedule within
the budget less base(S) and the transient bound, replayed by the simulator with S streamed); the fastest
feasible one wins with the same tie-break. Exponential: chains of a few stages only.
"""

from __future__ import annotations

import itertools
from types import ModuleType

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.solvers.weight_plan import Streamed, best_of

MAX_STAGES = 6


def every_set(length: int) -> list[tuple[int, ...]]:
    """All 2^L subsets of 1..L, smallest first."""
    stages = range(1, length + 1)
    return [combo for k in range(length + 1) for combo in itertools.combinations(stages, k)]


def best(chain: Chain, budget_bytes: int, module: ModuleType, slots: int) -> Streamed | None:
    """The fastest feasible subset with its schedule, or ``None`` when none fits.

    Raises:
        ValueError: the chain has more than ``MAX_STAGES`` stages.
    """
    if chain.length > MAX_STAGES:
        raise ValueError(f"the reference enumerates chains of at most {MAX_STAGES} stages, found {chain.length}")
    try:
        return best_of(chain, budget_bytes, module, every_set(chain.length), slots, "reference")
    except InfeasibleBudgetError:
        return None
