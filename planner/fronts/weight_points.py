"""Memory-vs-time points of weight-streaming schedules, for the Pareto plot beside the other algorithms."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from planner.errors import InfeasibleBudgetError, TableTooLargeError
from planner.model.chain import Chain
from planner.model.schedule_params import ScheduleParams
from planner.solvers import offload, store_all, weight_plan
from planner.solvers.common import Plan
from planner.solvers.discretize import DEFAULT_SLOTS
from planner.solvers.dispatch import solver, store_all_budget

STREAMING = "offload+weights"
"""The name weight-streaming schedules have in the points (``solve(..., stream_weights=True)``)."""

STREAM_POINTS_MAX_STAGES = 32
"""Above this many stages the Pareto plot leaves weight streaming out: each point replays O(L) streamed sets."""


def streaming_points(chain: Chain, slots: int = DEFAULT_SLOTS, sweep: int = 12) -> list[tuple]:
    """``(algorithm, budget, step peak, makespan, params JSON)`` of weight streaming at ``sweep`` budgets.

    Budgets are evenly spaced from its minimum feasible budget to store-all's peak; the activation schedule
    is offload's where the link is usable (read from one table on store-all's grid, as offload's own points
    are), else rotor's. Only for chains with step costs and weight costs
    (chains built from a trace) of at most ``STREAM_POINTS_MAX_STAGES`` stages; ``params`` carry
    ``host_peak_bytes`` (offloaded activations and the streamed stages' state) and ``streamed_weights``.
    """
    if chain.weights is None or chain.step is None or chain.length > STREAM_POINTS_MAX_STAGES:
        return []
    algorithm = "offload" if offload.usable(chain) else "rotor"
    rows = []
    try:
        module: Any = _OneTable(chain, slots) if algorithm == "offload" else solver(algorithm)
        low = weight_plan.min_budget_bytes(chain, module, slots)
        for budget in np.unique(np.linspace(low, max(store_all_budget(chain), low), sweep).astype(np.int64)):
            found = weight_plan.plan(chain, int(budget), module, slots, algorithm)
            params = {"slots": slots, "host_peak_bytes": found.host_peak_bytes,
                      "streamed_weights": list(found.streamed), "activations": algorithm}
            rows.append((STREAMING, int(budget), int(found.device_bytes), float(found.makespan_ms),
                         json.dumps(params, sort_keys=True)))
    except (InfeasibleBudgetError, TableTooLargeError):
        return rows
    return rows


class _OneTable:
    """The offload DP read from one table on store-all's grid, as the Pareto plot's offload points are
    (``planner.fronts.pareto``): each streamed set's activation budget is then a rebuild, not a table of its own.
    A chain with a host cap changes with the streamed set (the cap lowered); that one is solved as usual."""

    def __init__(self, chain: Chain, slots: int) -> None:
        self.chain = chain
        self.table = offload.compute_table(chain, store_all.store_all_peak_bytes(chain), slots)

    def plan(self, chain: Chain, budget_bytes: int, slots: int) -> Plan:
        if chain is not self.chain:
            return solver("offload").plan(chain, budget_bytes, slots)
        return Plan(offload.rebuild(self.table, int(budget_bytes)), ScheduleParams(slots=slots))

    def min_budget_bytes(self, chain: Chain, slots: int) -> int:
        if chain is not self.chain:
            return solver("offload").min_budget_bytes(chain, slots)
        found = offload.threshold_bytes(self.table)
        if found is None:
            raise InfeasibleBudgetError("offload finds no schedule on store-all's grid", budget_bytes=0,
                                        min_feasible_bytes=None)
        return found
