"""Each budget solved on its own grid (the ROTOR paper's M/S), and the minimum feasible budget under that rule.

``solve(chain, budget, "rotor")`` divides the budget itself into ``slots`` slots: the grid's reference is
the budget, capped at store-all's peak (``top``; no larger budget changes anything), so the budget is
exactly ``budget // slot`` slots and the rounding of each size costs at most one slot of ``budget /
slots`` bytes. A budget of at most ``slots`` bytes gets 1-byte slots and is solved exactly.

Every budget between ``(k-1) * slots + 1`` and ``k * slots`` bytes has slots of ``k`` bytes: one grid
(:func:`same_grid_budgets`). On one grid feasibility is monotone, so one feasibility test per grid gives
its threshold, the smallest budget that grid solves (a :data:`Threshold`). Across grids it is not: a
budget one byte larger can have one byte larger slots, round a size up by one slot more and miss a
schedule the smaller budget fits. :func:`lowest_budget` therefore defines the minimum feasible budget by
a search: it bisects between the DP's minimum on 1-byte slots (:func:`exact_floor`; no grid solves less)
and store-all's grid's threshold (the Pareto front's minimum), one feasibility test per probe, to a
budget ``B`` that its own grid solves while ``B - 1``'s does not.
Budgets above that minimum whose own grid finds nothing are given the minimum's schedule, which fits
(:func:`plan_on_own_grid`), so every budget from the minimum up is solved and every budget below it that
its own grid cannot solve names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import InfeasibleBudgetError
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import slot_bytes_for

Threshold = Callable[[int], int | None]
"""``threshold(reference_bytes)``: the smallest budget in bytes that the grid spanning ``reference_bytes``
solves (``None``: none up to its top)."""


@dataclass(frozen=True)
class Minimum:
    """The minimum feasible budget and the reference of the grid that solves it.

    Attributes:
        budget_bytes: the minimum feasible budget.
        reference_bytes: the reference of a grid with a schedule within ``budget_bytes``: the budget's own
            grid, or store-all's when the search found nothing below the Pareto front's minimum.
    """

    budget_bytes: int
    reference_bytes: int


def grid_reference(budget_bytes: int, top_bytes: int) -> int:
    """The reference a budget's own grid spans: the budget, capped at store-all's peak and at least 0."""
    return max(0, min(int(budget_bytes), int(top_bytes)))


def same_grid_budgets(budget_bytes: int, top_bytes: int, slots: int) -> tuple[int, float]:
    """``(low, high)``: the budgets whose own grid is ``budget_bytes``'s (``high`` is inf at the top grid)."""
    slot = slot_bytes_for(grid_reference(budget_bytes, top_bytes), slots)
    low = 0 if slot == 1 else (slot - 1) * slots + 1
    high = math.inf if slot == slot_bytes_for(top_bytes, slots) else slot * slots
    return low, high


def solved_on_own_grid(threshold: Threshold, budget_bytes: int, top_bytes: int) -> bool:
    """Whether ``budget_bytes``'s own grid has a schedule within it."""
    found = threshold(grid_reference(budget_bytes, top_bytes))
    return found is not None and found <= budget_bytes


def lowest_budget(threshold: Threshold, top_bytes: int, slots: int, floor_bytes: int = 0) -> Minimum | None:
    """The minimum feasible budget: bisection from store-all's grid down to an own-grid boundary.

    Invariants: every budget up to ``lo`` fails on its own grid; ``best`` is solved (on its own grid, or on
    store-all's for the start). Each probe tests one grid, which settles every budget sharing it: those
    from the grid's threshold up succeed, those below fail. Stops when ``best == lo + 1``.

    Args:
        threshold: the DP's feasibility test, per grid reference.
        top_bytes: store-all's peak, the largest reference.
        slots: slots per grid.
        floor_bytes: a budget below which no grid has a schedule, where the bisection starts: the DP's
            minimum on 1-byte slots (:func:`exact_floor`), since rounding sizes up only adds memory.

    Returns:
        The minimum, or ``None`` when store-all's grid has no schedule at all (so no budget has one).
    """
    first = threshold(top_bytes)
    if first is None:
        return None
    lo, best = min(max(floor_bytes, 0), first) - 1, Minimum(first, top_bytes)
    while best.budget_bytes - lo > 1:
        probe = (lo + best.budget_bytes) // 2
        low, high = same_grid_budgets(probe, top_bytes, slots)
        found = threshold(grid_reference(probe, top_bytes))
        if found is None or found > high:  # no budget of this grid succeeds
            lo = max(lo, int(min(high, best.budget_bytes - 1)))
            continue
        start = max(found, low)  # this grid's budgets from `start` up succeed
        if start < best.budget_bytes:
            best = Minimum(start, grid_reference(start, top_bytes))
        if found > low:  # and those from `low` to `found - 1` fail
            lo = max(lo, found - 1)
    return best


def lowest_budget_reference(threshold: Threshold, top_bytes: int) -> list[int]:
    """Slow reference for the tests: every own-grid boundary ``B`` (solved, ``B - 1`` not) up to store-all's
    grid threshold, found by testing every budget."""
    first = threshold(top_bytes)
    if first is None:
        return []
    solved = [solved_on_own_grid(threshold, budget, top_bytes) for budget in range(first + 1)]
    return [budget for budget in range(first + 1) if solved[budget] and (budget == 0 or not solved[budget - 1])]


def exact_floor(threshold_on: Callable[[int, int], int | None], top_bytes: int) -> int:
    """The DP's minimum on 1-byte slots up to store-all's peak (0 when it has none there).

    ``threshold_on(slots, reference_bytes)`` is the DP's feasibility test on any grid. Every size rounds
    up to at least itself, so no grid solves a budget this grid does not: a floor for :func:`lowest_budget`.
    """
    width = max(int(top_bytes), 1)
    return threshold_on(width, width) or 0


def plan_on_own_grid(
    algorithm: str,
    budget_bytes: int,
    top_bytes: int,
    solve_on: Callable[[int, int], Plan],
    minimum: Callable[[], Minimum | None],
    detail: str,
) -> Plan:
    """The DP's plan for ``budget_bytes`` on its own grid, else the minimum's when the budget is above it.

    Args:
        algorithm: the name, for the error.
        budget_bytes: the budget.
        top_bytes: store-all's peak.
        solve_on: ``solve_on(reference_bytes, budget_bytes)``: the plan on that grid, raising
            ``InfeasibleBudgetError`` when it has none within the budget.
        minimum: the minimum feasible budget (:func:`lowest_budget`), computed only when needed.
        detail: how the grids are made, for the error.

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible budget, which the message names.
    """
    try:
        return solve_on(grid_reference(budget_bytes, top_bytes), budget_bytes)
    except InfeasibleBudgetError:
        lowest = minimum()
        if lowest is None or budget_bytes < lowest.budget_bytes:
            found = None if lowest is None else lowest.budget_bytes
            raise infeasible(algorithm, int(budget_bytes), found, detail) from None
    return solve_on(lowest.reference_bytes, lowest.budget_bytes)
