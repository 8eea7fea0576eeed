"""``solve(chain, budget_bytes, algorithm)``: one entry point to every rematerialization algorithm."""

from __future__ import annotations

import numbers

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.model.schedule import Schedule
from planner.model.step import step_infeasible
from planner.simulation.simulator import predict_with_host
from planner.solvers import carried_fit as carried
from planner.solvers import held, store_all, weight_plan
from planner.solvers.common import Plan
from planner.solvers.discretize import DEFAULT_SLOTS, check_slots
from planner.solvers.handover import HandingSolver
from planner.solvers.registry import ALGORITHMS, SOLVABLE, Solver, lookup

__all__ = ["ALGORITHMS", "SOLVABLE", "check_budget", "min_feasible_budget", "solve", "solve_held", "solver",
           "store_all_budget"]


def solver(algorithm: str) -> Solver:
    """The solver for ``algorithm``, with the turns to another algorithm that
    :mod:`planner.solvers.handover` decides (its module is ``lookup(algorithm).solver``).

    Raises:
        UnknownAlgorithmError: the name is not one of ``SOLVABLE`` (the message lists them).
    """
    lookup(algorithm)  # an unknown name fails here, naming the known ones
    return HandingSolver(algorithm)


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
    return int(budget_bytes)  # type: ignore[call-overload]  # a Real that is_integer(), checked above


def solve(chain: Chain, budget_bytes: int, algorithm: str = "rotor", slots: int = DEFAULT_SLOTS,
          stream_weights: bool = False) -> Schedule:
    """The ``algorithm``'s schedule for ``chain`` within ``budget_bytes``, with its simulated prediction.

    Args:
        chain: the chain.
        budget_bytes: the memory budget. For a chain built from a trace (``chain.step`` set) it is the whole
            training step's memory, what the device has; for a hand-written chain it is the ROTOR paper's M
            (input, activations, their gradients and overheads). ``chain.activations_only()`` asks for M.
        algorithm: one of ``SOLVABLE``. ``"rotor"`` on a chain whose DP tables would exceed
            ``planner.solvers.rotor.MAX_TABLE_BYTES`` (1 GiB: from about L = 517 at 500 slots) falls back to
            ``"binomial"`` with a :class:`planner.errors.FallbackWarning`; the schedule's ``algorithm`` is then
            ``"binomial"`` and its params record ``fallback_from``. ``"selective"`` is rotor where each recorded
            forward also picks one of its stage's recomputation options (``Stage.options``); the same
            fallback applies.
        slots: memory slots of the dynamic programs, spanning the budget (capped at store-all's peak): the
            paper's M/S. ``pareto_front`` instead reads every budget from one table on store-all's grid.
        stream_weights: also choose stages whose weights, gradients and optimizer state live in host memory
            and are streamed to the device around their computations (:mod:`planner.solvers.weight_plan`); the chosen
            stages are ``schedule.params.streamed_weights``. Needs ``chain.weights`` (chains from a trace).

    Raises:
        UnknownAlgorithmError: unknown ``algorithm``.
        InfeasibleBudgetError: the budget is below the algorithm's minimum feasible budget (named), or below
            what the step needs outside the chain (said what dominates).
        TypeError: ``budget_bytes`` is not a whole number.
        ValueError: ``slots`` is not a whole number >= 1.
        TableTooLargeError: ``rotor_optimal`` (or ``offload``) on a chain too long for its tables.
        SearchTooLargeError: ``exact`` on a chain of more than 8 stages.
        ChainError: ``stream_weights`` on a chain without weight costs.
    """
    module = solver(algorithm)
    budget = check_budget(budget_bytes)
    check_slots(slots)
    if stream_weights:
        return _solve_streaming(chain, budget, algorithm, module, slots)
    inner = _chain_budget(chain, budget, algorithm, slots)
    try:
        if chain.carried:
            plan = carried.fit(chain, inner, lambda c, m: module.plan(c, m, slots),
                               lambda: int(module.min_budget_bytes(chain, slots)))
        else:
            plan = module.plan(chain, inner, slots)
    except InfeasibleBudgetError as exc:
        raise _as_step_error(chain, exc, budget, algorithm) from None
    schedule = _predicted(chain, plan, algorithm, budget)
    if (schedule.predicted_peak_bytes or 0) > inner:
        raise AssertionError(f"{schedule.algorithm} returned a schedule peaking at {schedule.predicted_peak_bytes} "
                             f"bytes over its budget {inner}")
    return schedule


def solve_held(chain: Chain, held_budget_bytes: int, slots: int = held.DEFAULT_HELD_SLOTS) -> Schedule:
    """The schedule that recomputes least while the forward holds at most ``held_budget_bytes`` for the
    backward, with its simulated prediction (:mod:`planner.solvers.held`).

    Every stage runs once with one of its recomputation options (``Stage.options``); the budget bounds
    what stages 1..L keep until their backward, the chain's input and the loss stage not counted (a
    pipeline stage's stash per micro-batch; what torch.compile's ``activation_memory_budget`` is a
    fraction of). The peak is not bounded: it is predicted (``predicted_peak_bytes``). The schedule's
    ``params`` hold ``held_bytes`` (what the chosen options keep) and ``options`` (one per stage).

    Raises:
        InfeasibleBudgetError: the budget is below what the stages' lightest options hold (named).
        TypeError: ``held_budget_bytes`` is not a whole number.
        ValueError: ``slots`` is not a whole number >= 1.
    """
    budget = check_budget(held_budget_bytes)
    return _predicted(chain, held.plan(chain, budget, slots), held.NAME, budget)


def _predicted(chain: Chain, plan: Plan, algorithm: str, budget: int) -> Schedule:
    """``plan`` as a :class:`Schedule` with the simulator's prediction (a fallback names the algorithm
    that ran)."""
    peak, makespan, host_peak = predict_with_host(chain, plan.ops)  # carried tensors counted
    step_peak = chain.step.step_peak_bytes(peak) if chain.step is not None else None
    return Schedule(plan.algorithm or algorithm, budget, plan.ops, chain, peak, makespan, plan.params,
                    step_peak, host_peak)


def _solve_streaming(chain: Chain, budget: int, algorithm: str, module: Solver, slots: int) -> Schedule:
    found = weight_plan.plan(chain, budget, module, slots, algorithm)
    params = found.params.replace(streamed_weights=tuple(found.streamed))
    return Schedule(found.algorithm or algorithm, budget, found.ops, chain, found.peak_bytes, found.makespan_ms,
                    params, found.step_peak_bytes, found.host_peak_bytes)


def _chain_budget(chain: Chain, budget: int, algorithm: str, slots: int) -> int:
    if chain.step is None:
        return budget
    if budget < chain.step.floor_bytes:
        raise step_infeasible(chain.step, algorithm, budget, min_feasible_budget(chain, algorithm, slots))
    return chain.step.chain_budget_bytes(budget)


def _as_step_error(chain: Chain, exc: InfeasibleBudgetError, budget: int, algorithm: str) -> InfeasibleBudgetError:
    """The solver's error in whole-step terms (its numbers are the chain's own budget)."""
    if chain.step is None:
        return exc
    minimum = None
    if exc.min_feasible_bytes is not None:
        minimum = max(chain.step.floor_bytes, exc.min_feasible_bytes + chain.step.base_bytes)
    return step_infeasible(chain.step, algorithm, budget, minimum)


def min_feasible_budget(chain: Chain, algorithm: str = "rotor", slots: int = DEFAULT_SLOTS,
                        stream_weights: bool = False) -> int:
    """The minimum feasible budget in bytes of ``solve(chain, budget, algorithm, slots)``.

    ``solve`` succeeds at it and at every budget above it, and one byte below it raises
    ``InfeasibleBudgetError`` naming it. For the dynamic programs, whose grid follows the budget, it is
    found by bisection (see ``planner/solvers/budget_grid.py``); a few budgets below it may also be solved.

    For a chain with step costs it is the whole step's memory (see :func:`solve`). With ``stream_weights``
    it is the least over the sets of streamed stages :func:`solve` tries.

    Raises:
        UnknownAlgorithmError: unknown ``algorithm``.
        InfeasibleBudgetError: ``revolve`` finds no schedule at any budget.
        TableTooLargeError: ``rotor_optimal`` or ``offload`` on a chain too long for its tables.
    """
    module = solver(algorithm)
    check_slots(slots)
    if stream_weights:
        return weight_plan.min_budget_bytes(chain, module, slots)
    inner = int(module.min_budget_bytes(chain, slots))
    if chain.carried:
        inner = carried.min_budget_bytes(chain, lambda c, m: module.plan(c, m, slots), inner)
    if chain.step is None:
        return inner
    return max(chain.step.floor_bytes, inner + chain.step.base_bytes)


def store_all_budget(chain: Chain) -> int:
    """Store-all's predicted peak: the budget above which no algorithm recomputes anything.

    For a chain with step costs it is the whole step's predicted peak.
    """
    peak = store_all.store_all_peak_bytes(chain)
    if chain.carried:
        peak = carried.peak_bytes(chain, store_all.plan(chain, peak).ops)
    return peak if chain.step is None else chain.step.step_peak_bytes(peak)
