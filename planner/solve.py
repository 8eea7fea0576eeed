"""``solve(chain, budget_bytes, algorithm)``: one entry point to every rematerialization algorithm."""

from __future__ import annotations

import numbers
from types import ModuleType

from planner.chain import Chain
from planner.discretize import DEFAULT_SLOTS, check_slots
from planner.errors import UnknownAlgorithmError
from planner.schedule import Schedule
from planner.simulator import predict
from planner.solvers import exact, periodic, revolve, rotor, rotor_optimal, sqrt, store_all

ALGORITHMS = ("store_all", "periodic", "sqrt", "revolve", "rotor", "rotor_optimal")
"""The algorithms for users; ``solve`` also takes ``"exact"`` (exhaustive search, small chains only)."""

SOLVABLE = (*ALGORITHMS, "exact")

_SOLVERS: dict[str, ModuleType] = {
    "store_all": store_all,
    "periodic": periodic,
    "sqrt": sqrt,
    "revolve": revolve,
    "rotor": rotor,
    "rotor_optimal": rotor_optimal,
    "exact": exact,
}


def solver(algorithm: str) -> ModuleType:
    """The module implementing ``algorithm``.

    Raises:
        UnknownAlgorithmError: the name is not one of ``SOLVABLE`` (the message lists them).
    """
    if algorithm not in _SOLVERS:
        raise UnknownAlgorithmError(f"unknown algorithm {algorithm!r}; expected one of {', '.join(SOLVABLE)}")
    return _SOLVERS[algorithm]


def check_budget(budget_bytes: object) -> int:
    """``budget_bytes`` as an int.

    Raises:
        TypeError: not a whole number of bytes (e.g. a string such as ``"64MiB"``: parse it first with
            ``memprof.units.parse_bytes``).
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
        raise TypeError(f"budget_bytes must be a whole number of bytes, found {budget_bytes!r}")
    if not float(budget_bytes).is_integer():
        raise TypeError(f"budget_bytes must be a whole number of bytes, found {budget_bytes!r}")
    return int(budget_bytes)


def solve(chain: Chain, budget_bytes: int, algorithm: str = "rotor", slots: int = DEFAULT_SLOTS) -> Schedule:
    """The ``algorithm``'s schedule for ``chain`` within ``budget_bytes``, with its simulated prediction.

    Args:
        chain: the chain.
        budget_bytes: the memory budget (what the ROTOR paper's M counts: input, activations, their
            gradients and overheads).
        algorithm: one of ``SOLVABLE``.
        slots: memory slots of the dynamic programs, spanning the budget (capped at store-all's peak): the
            paper's M/S. ``pareto_front`` instead reads every budget from one table on store-all's grid.

    Raises:
        UnknownAlgorithmError: unknown ``algorithm``.
        InfeasibleBudgetError: the budget is below the algorithm's minimum feasible budget (named).
        TypeError: ``budget_bytes`` is not a whole number.
        ValueError: ``slots`` is not a whole number >= 1.
        TableTooLargeError: ``rotor_optimal`` on a chain too long for its ``O(L^3 * slots)`` tables.
        SearchTooLargeError: ``exact`` on a chain of more than 8 stages.
    """
    module = solver(algorithm)
    budget = check_budget(budget_bytes)
    check_slots(slots)
    plan = module.plan(chain, budget, slots)
    peak, makespan = predict(chain, plan.ops)
    if peak > budget:
        raise AssertionError(f"{algorithm} returned a schedule peaking at {peak} bytes over its budget {budget}")
    return Schedule(algorithm, budget, plan.ops, chain, peak, makespan, dict(plan.params))


def min_feasible_budget(chain: Chain, algorithm: str = "rotor", slots: int = DEFAULT_SLOTS) -> int:
    """The minimum feasible budget in bytes of ``solve(chain, budget, algorithm, slots)``.

    ``solve`` succeeds at it and at every budget above it, and one byte below it raises
    ``InfeasibleBudgetError`` naming it. For the dynamic programs, whose grid follows the budget, it is
    found by bisection (see ``planner/solvers/budget_grid.py``); a few budgets below it may also be solved.

    Raises:
        UnknownAlgorithmError: unknown ``algorithm``.
        InfeasibleBudgetError: ``revolve`` finds no schedule at any budget.
        TableTooLargeError: ``rotor_optimal`` on a chain too long for its tables.
    """
    module = solver(algorithm)
    check_slots(slots)
    return int(module.min_budget_bytes(chain, slots))


def store_all_budget(chain: Chain) -> int:
    """Store-all's simulated peak: the budget above which no algorithm recomputes anything."""
    return store_all.store_all_peak_bytes(chain)
