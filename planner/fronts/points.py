"""Memory-vs-time points of every algorithm on one chain, for the Pareto plot.

The DP algorithms' points are read from their fronts (:mod:`planner.fronts.pareto`); the others are solved or
built at a sweep of their own parameters. Every peak is simulated, the carried tensors counted.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from planner.errors import InfeasibleBudgetError, TableTooLargeError
from planner.fronts.pareto import pareto_front, peak_and_makespan
from planner.fronts.weight_points import streaming_points
from planner.model.chain import Chain
from planner.simulation.simulator import predict_with_host
from planner.solvers import binomial, offload, periodic, sqrt, store_all
from planner.solvers.binomial_split import binomial_ops
from planner.solvers.discretize import DEFAULT_SLOTS

POINT_COLUMNS = ("algorithm", "budget_bytes", "peak_bytes", "makespan_ms", "params")


def algorithm_points(chain: Chain, slots: int = DEFAULT_SLOTS, sweep: int = 12) -> pd.DataFrame:
    """Memory-vs-time points of every algorithm, for the Pareto plot.

    store_all and sqrt give one point each, periodic one per segment count (2..L), revolve and rotor
    ``sweep`` budgets evenly spaced from their minimum feasible budget to store-all's peak; offload as many,
    read from one table on store-all's grid, for chains of at most ``OFFLOAD_POINTS_MAX_STAGES`` stages
    whose link is usable (its ``params`` carry ``host_peak_bytes``); and binomial up to ``sweep`` snapshot
    counts evenly spaced from the fewest to L (budget: its memory bound); selective, when some stage has
    recomputation options (``Stage.options``), ``sweep`` budgets as rotor's; for a chain from a trace (weight
    costs), weight streaming as ``"offload+weights"`` (:mod:`planner.fronts.weight_points`). ``peak_bytes``
    and ``makespan_ms`` are simulated; ``budget_bytes`` is the budget solved for (the peak itself for the
    algorithms that take no budget); ``params`` is a JSON string. For a chain with step costs, budgets and
    peaks are the whole step's (:meth:`planner.model.step.StepCosts.step_peak_bytes` of the simulated chain peak).

    Returns:
        A DataFrame with columns ``POINT_COLUMNS``.
    """
    rows: list[tuple] = []
    step = chain.step

    def whole(chain_bytes: int) -> int:
        return int(chain_bytes) if step is None else step.step_peak_bytes(int(chain_bytes))

    def add(algorithm: str, budget: int | None, ops: tuple, params: dict,
            predicted: tuple[int, float] | None = None) -> None:
        """One row; ``budget`` None: the peak itself; ``predicted``: (chain peak, makespan) already simulated."""
        peak, makespan = predicted if predicted is not None else peak_and_makespan(chain, ops)
        step_budget = whole(peak) if budget is None else int(budget)
        rows.append((algorithm, step_budget, whole(peak), makespan, json.dumps(params, sort_keys=True)))

    add("store_all", None, store_all.store_all_ops(chain), {})
    for segments, peak, _ in periodic.candidates(chain)[1:]:
        add("periodic", whole(peak), periodic.periodic_ops(chain, segments), {"segments": segments})
    add("sqrt", None, sqrt.sqrt_ops(chain), {"segment_length": sqrt.segment_length(chain)})
    for algorithm in ("revolve", "rotor", *(("selective",) if has_options(chain) else ())):
        try:
            front = pareto_front(chain, algorithm, slots)
        except InfeasibleBudgetError:  # revolve can find no schedule at any budget (a^l too large to keep)
            continue
        for budget in np.unique(np.linspace(front.min_feasible_bytes, front.max_budget_bytes, sweep).astype(np.int64)):
            schedule = front.schedule_at(int(budget))  # simulated there: its prediction is the row's
            add(algorithm, int(budget), schedule.ops, {"slots": slots},
                (int(schedule.predicted_peak_bytes or 0), float(schedule.predicted_makespan_ms or 0.0)))
    bounds = binomial.memory_bounds(chain)
    for snapshots in binomial.snapshot_sweep(chain.length, sweep):
        add("binomial", whole(bounds[snapshots]), binomial_ops(chain.length, snapshots), {"snapshots": snapshots})
    for budget, ops in _offload_points(chain, slots, sweep):
        add("offload", whole(budget), ops, {"slots": slots, "host_peak_bytes": predict_with_host(chain, ops)[2]})
    rows += streaming_points(chain, slots, sweep)  # chains with weight costs: "offload+weights"
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def has_options(chain: Chain) -> bool:
    """Whether some stage of ``chain`` has recomputation options (``selective`` can then beat ``rotor``)."""
    return any(stage.options for stage in chain.stages)


OFFLOAD_POINTS_MAX_STAGES = 64
"""Above this many stages the Pareto plot leaves offload out: its table takes seconds to fill (1.8 s at L=100)."""


def _offload_points(chain: Chain, slots: int, sweep: int) -> list[tuple[int, tuple]]:
    """``(chain budget, ops)`` of the offload DP at ``sweep`` budgets, from one table on store-all's grid."""
    if chain.length > OFFLOAD_POINTS_MAX_STAGES or not offload.usable(chain):
        return []
    top = store_all.store_all_peak_bytes(chain)
    try:
        table = offload.compute_table(chain, top, slots)
    except TableTooLargeError:
        return []
    lowest = offload.threshold_bytes(table)
    if lowest is None:
        return []
    budgets = np.unique(np.linspace(lowest, top, sweep).astype(np.int64))
    return [(int(budget), offload.rebuild(table, int(budget))) for budget in budgets]
