"""The ROTOR paper's "revolve" baseline: only activations ``a^l`` are checkpointed, ``F_all`` right before each ``B``.

This is the optimal persistent schedule of the automatic-differentiation model (Griewank & Walther's
revolve, adapted to heterogeneous costs as in Appendix C of Gruslys et al. 2016): the forward pass stores
some ``a^l`` (``F_ck``) and drops the rest (``F_none``), and every backward step ``B(l)`` is preceded
immediately by ``F_all(l)`` re-run from ``a^{l-1}``. The placement of the checkpoints is optimal under the
budget: it is ROTOR's persistent DP with ``F_all(s)`` allowed only when ``B(s)`` follows at once, with the
true memory of every operation counted, so the schedules never exceed their budget.
"""

from __future__ import annotations

from planner.model.chain import Chain
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS
from planner.solvers.rotor import RotorTable, compute_table, minimum, plan_mode
from planner.solvers.store_all import store_all_peak_bytes


def revolve_table(chain: Chain, slots: int = DEFAULT_SLOTS) -> RotorTable:
    """The revolve DP's table on store-all's grid, for every memory 0..slots (one table for every budget)."""
    return compute_table(chain, slots, mode="revolve")


def min_budget_bytes(chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
    """The smallest budget for which revolve finds a schedule (each budget on its own grid).

    Raises:
        InfeasibleBudgetError: revolve finds none up to store-all's grid's top (possible only when some
            ``F_all`` beside its ``delta`` needs more than store-all's peak).
    """
    found = minimum(chain, slots, "revolve")
    if found is None:
        raise infeasible("revolve", store_all_peak_bytes(chain), None, f"{slots} slots")
    return found.budget_bytes


def plan(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
    """The optimal revolve schedule within ``budget_bytes``, on the budget's own grid.

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one.
    """
    return plan_mode(chain, budget_bytes, slots, "revolve")
