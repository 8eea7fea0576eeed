"""Store-all: PyTorch's default -- every stage recorded once, no recomputation."""

from __future__ import annotations

from planner.model.chain import Chain
from planner.simulation.baseline import store_all_ops, store_all_peak_bytes
from planner.solvers.common import Plan, infeasible

__all__ = ["min_budget_bytes", "plan", "store_all_ops", "store_all_peak_bytes"]


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
