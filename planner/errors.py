"""Exceptions raised by the planner. Messages say what was expected and what was found."""

from __future__ import annotations

from memprof.errors import MemprofError


class PlannerError(MemprofError):
    """Base class of planner errors."""


class ChainError(PlannerError, ValueError):
    """A chain's costs are malformed (wrong lengths, negative, NaN or infinite values)."""


class ChainWarning(UserWarning):
    """A chain's costs were accepted after a correction (e.g. a-bar measured slightly below a)."""


class FallbackWarning(UserWarning):
    """A solver handed the problem to another algorithm (e.g. ``rotor`` to ``binomial`` on a chain whose DP
    table would exceed the memory allowed to it); the message says why and what ran instead."""


class NotAChainError(PlannerError):
    """No sequential chain could be found in a trace or model."""


class InfeasibleBudgetError(PlannerError):
    """No valid schedule fits the memory budget.

    Attributes:
        budget_bytes: the budget that was asked for.
        min_feasible_bytes: the smallest budget for which a schedule exists (for this algorithm).
    """

    def __init__(self, message: str, budget_bytes: int, min_feasible_bytes: int | None) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes


class InvalidScheduleError(PlannerError, ValueError):
    """A schedule breaks a data dependency or names a stage that does not exist."""


class ScheduleMismatchError(PlannerError, ValueError):
    """A schedule was made for another chain than the one it is applied to."""


class UnknownAlgorithmError(PlannerError, ValueError):
    """An algorithm name is not one the planner knows."""


class SearchTooLargeError(PlannerError, ValueError):
    """The chain is too long (or the state space too large) for exhaustive search (``exact``)."""


class TableTooLargeError(PlannerError, ValueError):
    """The weak-persistent DP's tables (``rotor_optimal``) would not fit the memory allowed to them."""
