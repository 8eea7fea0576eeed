"""Memory-vs-time points of weight-streaming schedules, for the Pareto plot beside the other algorithms."""

from __future__ import annotations

import json

import numpy as np

from planner.chain import Chain
from planner.discretize import DEFAULT_SLOTS
from planner.errors import InfeasibleBudgetError, TableTooLargeError
from planner.solve import min_feasible_budget, solve, store_all_budget
from planner.solvers import offload

STREAMING = "offload+weights"
"""The name weight-streaming schedules have in the points (``solve(..., stream_weights=True)``)."""

STREAM_POINTS_MAX_STAGES = 12
"""Above this many stages the Pareto plot leaves weight streaming out: each point solves O(L) activation plans."""


def streaming_points(chain: Chain, slots: int = DEFAULT_SLOTS, sweep: int = 12) -> list[tuple]:
    """``(algorithm, budget, step peak, makespan, params JSON)`` of weight streaming at ``sweep`` budgets.

    Budgets are evenly spaced from its minimum feasible budget to store-all's peak; the activation schedule
    is offload's where the link is usable, else rotor's. Only for chains with step costs and weight costs
    (chains built from a trace) of at most ``STREAM_POINTS_MAX_STAGES`` stages; ``params`` carry
    ``host_peak_bytes`` (offloaded activations and the streamed stages' state) and ``streamed_weights``.
    """
    if chain.weights is None or chain.step is None or chain.length > STREAM_POINTS_MAX_STAGES:
        return []
    algorithm = "offload" if offload.usable(chain) else "rotor"
    rows = []
    try:
        low = min_feasible_budget(chain, algorithm, slots, stream_weights=True)
        for budget in np.unique(np.linspace(low, max(store_all_budget(chain), low), sweep).astype(np.int64)):
            schedule = solve(chain, int(budget), algorithm, slots, stream_weights=True)
            params = {"slots": slots, "host_peak_bytes": schedule.predicted_host_peak_bytes or 0,
                      "streamed_weights": list(schedule.streamed_weights), "activations": algorithm}
            rows.append((STREAMING, int(budget), int(schedule.predicted_step_peak_bytes or 0),
                         float(schedule.predicted_makespan_ms or 0.0), json.dumps(params, sort_keys=True)))
    except (InfeasibleBudgetError, TableTooLargeError):
        return rows
    return rows
