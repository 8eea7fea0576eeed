"""Store-all: PyTorch's default -- every stage recorded once, no recomputation."""

from __future__ import annotations

from planner.chain import Chain
from planner.schedule import Op
from planner.simulator import predict
from planner.solvers.common import Plan, backward_all, forward_all, infeasible


def store_all_ops(chain: Chain) -> tuple[Op, ...]:
    """``F_all(1) .. F_all(L+1)`` then ``B(L+1) .. B(1)``."""
    top = chain.length + 1
    return tuple(forward_all(1, top) + backward_all(top, 1))


def store_all_peak_bytes(chain: Chain) -> int:
    """Store-all's simulated peak: the largest budget any algorithm needs."""
    return predict(chain, store_all_ops(chain))[0]


def min_budget_bytes(chain: Chain, slots: int = 0) -> int:
    """Store-all's peak (``slots`` is unused: store-all needs no discretisation)."""
    return store_all_peak_bytes(chain)


def plan(chain: Chain, budget_bytes: int, slots: int = 0) -> Plan:
    """The store-all schedule, when it fits ``budget_bytes``.

    Raises:
        InfeasibleBudgetError: its peak is above the budget.
    """
    peak = store_all_peak_bytes(chain)
    if budget_bytes < peak:
        raise infeasible("store_all", budget_bytes, peak)
    return Plan(store_all_ops(chain))
