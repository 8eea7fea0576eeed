"""One module per rematerialization algorithm; :mod:`planner.solvers.dispatch` dispatches to them by name.

Every module exposes ``plan(chain, budget_bytes, slots) -> Plan`` (raising
:class:`~planner.errors.InfeasibleBudgetError` when the budget is too small) and
``min_budget_bytes(chain, slots) -> int``.
"""

# The algorithms, one module each (``from planner.solvers import *`` loads them). budget_grid, common, option_grid,
# binomial_split and rotor_fill (offload_fill) are their shared parts; the reference/ modules are plain-Python twins the
# tests compare with.
__all__ = ["binomial", "exact", "held", "offload", "periodic", "revolve", "rotor", "rotor_optimal", "selective", "sqrt",
           "store_all"]
