"""Where one algorithm hands a chain to another: every fallback between solvers, in one place.

* ``rotor`` and ``selective`` hand the chain to ``binomial`` (no table) when their DP tables would exceed
  ``planner.solvers.rotor.MAX_TABLE_BYTES``, with a :class:`~planner.errors.FallbackWarning`; the plan is then
  named ``"binomial"`` and its params record ``fallback_from``, the tables' estimated bytes and the limit.
* ``offload`` hands it to ``rotor`` (and so, possibly, on to ``binomial``) when there is nothing to offload: no
  usable link, or no stage whose a-bar exceeds its a (:func:`planner.solvers.offload.usable`); the plan keeps
  offload's name, with ``offloaded: []``.

The solver modules themselves run their own algorithm only; :func:`planner.solvers.dispatch.solver` hands out
:class:`HandingSolver`, so ``solve``, ``min_feasible_budget``, weight streaming and the fronts' points all
take the same turns.
"""

from __future__ import annotations

import warnings

from memprof.units import format_bytes
from planner.errors import FallbackWarning, InfeasibleBudgetError
from planner.model.chain import Chain
from planner.solvers import offload, rotor
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS
from planner.solvers.registry import lookup

__all__ = ["HandingSolver", "table_fallback"]

_TABLED = {"rotor": "", "selective": ", without recomputation options"}  # algorithms with rotor-sized tables
_STACK = 4  # the warning points at the caller of solve / min_feasible_budget (through plan and _route)


class HandingSolver:
    """The :class:`~planner.solvers.registry.Solver` for ``name``, with the turns the module docstring lists."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.module = lookup(name).solver

    def plan(self, chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
        """The plan of the algorithm that runs for ``name`` on ``chain``."""
        if self.name == "offload" and not offload.usable(chain):
            try:
                found = HandingSolver("rotor").plan(chain, budget_bytes, slots)
            except InfeasibleBudgetError as exc:
                raise infeasible("offload", int(budget_bytes), exc.min_feasible_bytes,
                                 f"{slots} slots spanning each budget; nothing to offload, so rotor's") from None
            return Plan(found.ops, found.params.replace(offloaded=(), transfer=chain.transfer_costs.source))
        needed = table_fallback(self.name, chain, slots)
        if needed is None:
            return self.module.plan(chain, budget_bytes, slots)
        found = lookup("binomial").solver.plan(chain, budget_bytes, slots)
        params = found.params.replace(fallback_from=self.name, table_bytes_estimate=needed,
                                      max_table_bytes=rotor.MAX_TABLE_BYTES)
        return Plan(found.ops, params, algorithm="binomial")

    def min_budget_bytes(self, chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
        """The smallest chain budget :meth:`plan` succeeds at."""
        if self.name == "offload" and not offload.usable(chain):
            return HandingSolver("rotor").min_budget_bytes(chain, slots)
        if table_fallback(self.name, chain, slots) is not None:
            return lookup("binomial").solver.min_budget_bytes(chain, slots)
        return self.module.min_budget_bytes(chain, slots)


def table_fallback(name: str, chain: Chain, slots: int) -> int | None:
    """The tables' estimated bytes when ``name``'s would exceed ``rotor.MAX_TABLE_BYTES`` (warning that binomial
    runs instead), else ``None``."""
    if name not in _TABLED:
        return None
    needed = rotor.table_bytes_estimate(chain.length, slots)
    if needed <= rotor.MAX_TABLE_BYTES:
        return None
    warnings.warn(
        f"{name} on {chain.length} stages with {slots} slots: its tables would take about {format_bytes(needed)} "
        f"({needed} bytes), over the {format_bytes(rotor.MAX_TABLE_BYTES)} ({rotor.MAX_TABLE_BYTES} bytes) allowed "
        f"(planner.solvers.rotor.MAX_TABLE_BYTES); solving with binomial checkpointing instead (no table"
        f"{_TABLED[name]}; see docs/planner.md)",
        FallbackWarning,
        stacklevel=_STACK,
    )
    return needed
