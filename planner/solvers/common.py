"""What every solver returns, and helpers shared by the solvers."""

from __future__ import annotations

from dataclasses import dataclass, field

from memprof.units import format_bytes
from planner.errors import InfeasibleBudgetError
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams


@dataclass(frozen=True)
class Plan:
    """A solver's answer: the operations and the parameters that produced them.

    Attributes:
        ops: the operations.
        params: the parameters that produced them.
        algorithm: the algorithm that produced them when it is not the one asked for (a fallback, e.g.
            ``"binomial"`` for a ``rotor`` whose table would be too large); ``None`` otherwise.
    """

    ops: tuple[Op, ...]
    params: ScheduleParams = field(default_factory=ScheduleParams)
    algorithm: str | None = None


def forward_all(first: int, last: int) -> list[Op]:
    """``F_all(first) .. F_all(last)``."""
    return [Op(OpKind.F_ALL, stage) for stage in range(first, last + 1)]


def backward_all(last: int, first: int) -> list[Op]:
    """``B(last) .. B(first)``, descending."""
    return [Op(OpKind.B, stage) for stage in range(last, first - 1, -1)]


def checkpointed_forward(first: int, last: int) -> list[Op]:
    """``F_ck(first) F_none(first+1) .. F_none(last)``: keeps ``a^{first-1}``, records nothing."""
    return [Op(OpKind.F_CK, first)] + [Op(OpKind.F_NONE, stage) for stage in range(first + 1, last + 1)]


def infeasible(algorithm: str, budget_bytes: int, min_bytes: int | None, detail: str = "") -> InfeasibleBudgetError:
    """The error for a budget below ``min_bytes``, naming the minimum in bytes and in human units.

    ``min_bytes`` is ``None`` when the algorithm finds no schedule at any budget its grid represents.
    """
    extra = f" ({detail})" if detail else ""
    if min_bytes is None:
        return InfeasibleBudgetError(
            f"{algorithm} finds no schedule at any budget{extra}; budget asked: {budget_bytes} bytes "
            f"({format_bytes(budget_bytes)}); try rotor, which can always fall back to store-all",
            budget_bytes=budget_bytes,
            min_feasible_bytes=None,
        )
    return InfeasibleBudgetError(
        f"budget {budget_bytes} bytes ({format_bytes(budget_bytes)}) is below the minimum feasible budget "
        f"for {algorithm}{extra}: {min_bytes} bytes ({format_bytes(min_bytes)})",
        budget_bytes=budget_bytes,
        min_feasible_bytes=min_bytes,
    )


def segmented_ops(length: int, bounds: list[tuple[int, int]]) -> tuple[Op, ...]:
    """A checkpointed-segments schedule: each ``(first, last)`` segment runs without recording and keeps
    its input, the rest of the chain and the loss run recorded, then each segment is recomputed
    recorded just before its backward (how ``checkpoint_sequential`` runs)."""
    rest_first = bounds[-1][1] + 1 if bounds else 1
    top = length + 1
    ops: list[Op] = []
    for first, last in bounds:
        ops += checkpointed_forward(first, last)
    ops += forward_all(rest_first, top) + backward_all(top, rest_first)
    for first, last in reversed(bounds):
        ops += forward_all(first, last) + backward_all(last, first)
    return tuple(ops)
