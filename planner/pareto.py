"""Memory-vs-time trade-offs: the Pareto front of one DP, and the points of every algorithm.

One DP solve for the largest useful budget (store-all's peak) yields the optimum of every smaller
budget, since the table holds every memory 0..slots. :class:`ParetoFront` keeps that table, so the
dashboard's budget slider calls :meth:`ParetoFront.schedule_at`, which only reads a schedule out of it.

For a chain built from a trace (``chain.step`` set) every budget and peak here is the whole training
step's memory, as in :func:`planner.solve.solve`: the table is solved on the chain's own grid once, and its
budgets are converted with :class:`planner.step.StepCosts` (a chain budget ``m`` is the step budget
``max(floor, m + base)``, and a step budget ``B`` leaves the chain ``B - base``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.chain import Chain
from planner.discretize import DEFAULT_SLOTS
from planner.errors import InfeasibleBudgetError, TableTooLargeError, UnknownAlgorithmError
from planner.schedule import Schedule
from planner.simulator import predict, predict_with_host
from planner.solvers import binomial, offload, periodic, rotor, rotor_optimal, selective, sqrt, store_all
from planner.solvers.binomial_split import binomial_ops
from planner.solvers.common import infeasible
from planner.step import StepCosts, step_infeasible
from planner.weight_points import streaming_points

FRONT_ALGORITHMS = ("rotor", "revolve", "rotor_optimal", "selective")
POINT_COLUMNS = ("algorithm", "budget_bytes", "peak_bytes", "makespan_ms", "params")
_RELATIVE_STEP = 1e-6  # float32 tables: smaller makespan differences are rounding, not a new optimum


@dataclass(frozen=True, eq=False)
class ParetoFront:
    """Every optimum of one DP algorithm over budgets, from one table.

    Budgets and peaks are the whole training step's memory when the chain carries step costs
    (``chain.step``), the chain's own memory (the ROTOR paper's M) otherwise.

    Attributes:
        chain: the chain.
        algorithm: ``"rotor"``, ``"revolve"``, ``"rotor_optimal"`` or ``"selective"`` (rotor with each
            stage's recomputation options, :mod:`planner.solvers.selective`).
        slots: the memory slots spanning store-all's peak.
        budgets_bytes: int64, increasing: the smallest budget at which each distinct optimum is reached.
        makespans_ms: float64, decreasing: the optimum's makespan as the DP table holds it (float32
            precision for rotor/revolve; :meth:`schedule_at` gives the simulator's exact value).
        min_feasible_bytes: the smallest budget with a schedule (``budgets_bytes[0]``).
        max_budget_bytes: store-all's peak: no budget above it changes anything.
        table: the DP table the schedules are read from (on the chain's own budgets).
    """

    chain: Chain
    algorithm: str
    slots: int
    budgets_bytes: np.ndarray
    makespans_ms: np.ndarray
    min_feasible_bytes: int
    max_budget_bytes: int
    table: rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable

    @property
    def step(self) -> StepCosts | None:
        """The step costs the budgets include (``None``: budgets are the chain's own)."""
        return self.chain.step

    def chain_budget_bytes(self, budget_bytes: int) -> int:
        """The chain's own budget (the paper's M) inside ``budget_bytes`` (the same number without step costs)."""
        step = self.chain.step
        return int(budget_bytes) if step is None else step.chain_budget_bytes(int(budget_bytes))

    def makespan_at(self, budget_bytes: int) -> float:
        """The optimal makespan within ``budget_bytes`` (from the front, no rebuild).

        Raises:
            InfeasibleBudgetError: below the minimum feasible budget.
        """
        position = int(np.searchsorted(self.budgets_bytes, budget_bytes, side="right")) - 1
        if position < 0:
            raise self._infeasible(int(budget_bytes))
        return float(self.makespans_ms[position])

    def schedule_at(self, budget_bytes: int) -> Schedule:
        """The optimal schedule within ``budget_bytes``, read from the stored table (no new DP).

        For a chain with step costs, ``budget_bytes`` is the whole step's memory; the schedule's
        ``budget_bytes`` is that budget and ``predicted_step_peak_bytes`` its whole-step peak.

        Raises:
            InfeasibleBudgetError: below the minimum feasible budget (named in the message, with what the
                step needs outside the chain when that is what dominates).
        """
        budget = int(budget_bytes)
        step = self.chain.step
        if step is not None and budget < self.min_feasible_bytes:
            raise self._infeasible(budget)
        inner = self.chain_budget_bytes(budget)
        if isinstance(self.table, rotor.RotorTable):
            ops = rotor.rebuild(self.table, inner)
        elif isinstance(self.table, selective.SelectiveTable):
            ops = selective.rebuild(self.table, inner)
        else:
            ops = rotor_optimal.rebuild(self.table, inner)
        peak, makespan = predict(self.chain, ops)
        params = {"slots": self.slots, "slot_bytes": self.table.grid.slot_bytes}
        step_peak = step.step_peak_bytes(peak) if step is not None else None
        return Schedule(self.algorithm, budget, ops, self.chain, peak, makespan, params,
                        predicted_step_peak_bytes=step_peak)

    def _infeasible(self, budget: int) -> InfeasibleBudgetError:
        step = self.chain.step
        if step is None:
            return infeasible(self.algorithm, budget, self.min_feasible_bytes)
        return step_infeasible(step, self.algorithm, budget, self.min_feasible_bytes)

    def to_frame(self) -> pd.DataFrame:
        """The front as a table with columns ``budget_bytes`` and ``makespan_ms``."""
        return pd.DataFrame({"budget_bytes": self.budgets_bytes, "makespan_ms": self.makespans_ms})


def pareto_front(chain: Chain, algorithm: str = "rotor", slots: int = DEFAULT_SLOTS) -> ParetoFront:
    """Solves the DP once for store-all's peak and lists every distinct optimum below it.

    Raises:
        UnknownAlgorithmError: ``algorithm`` is not a DP algorithm (``FRONT_ALGORITHMS``).
        InfeasibleBudgetError: the algorithm finds no schedule at any budget (revolve only).
    """
    if algorithm not in FRONT_ALGORITHMS:
        raise UnknownAlgorithmError(
            f"a Pareto front comes from a DP algorithm; expected one of {', '.join(FRONT_ALGORITHMS)}, "
            f"found {algorithm!r}"
        )
    if algorithm == "rotor_optimal":
        table: rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable = (
            rotor_optimal.compute_table(chain, slots))
    elif algorithm == "selective":
        table = selective.compute_table(chain, slots)
    else:
        table = rotor.compute_table(chain, slots, mode=algorithm)
    peak = store_all.store_all_peak_bytes(chain)
    # rotor and rotor_optimal answer store-all's peak and above with store-all; revolve reads its table there
    budgets, makespans = _distinct_optima(table.root_makespans(), table.grid.slot_bytes, peak,
                                          include_peak=algorithm == "revolve")
    if algorithm != "revolve":
        # store-all's exact peak can sit a rounding above the grid's last feasible point
        store_all_ms = predict(chain, store_all.store_all_ops(chain))[1]
        if not makespans or store_all_ms < makespans[-1] * (1 - _RELATIVE_STEP):
            budgets.append(peak)
            makespans.append(store_all_ms)
    if not budgets:
        top = peak if chain.step is None else chain.step.step_peak_bytes(peak)
        raise infeasible(algorithm, top, None, f"{slots} slots")
    if chain.step is not None:
        budgets, makespans = _in_step_terms(chain.step, budgets, makespans)
        peak = chain.step.step_peak_bytes(peak)
    return ParetoFront(chain, algorithm, slots, np.array(budgets, dtype=np.int64), np.array(makespans),
                       budgets[0], peak, table)


def _in_step_terms(step: StepCosts, budgets: list[int], makespans: list[float]) -> tuple[list[int], list[float]]:
    """Chain budgets as whole-step budgets: shifted by ``base``, clipped at the floor (the best optimum kept)."""
    out_budgets: list[int] = []
    out_makespans: list[float] = []
    for budget, makespan in zip(budgets, makespans):
        shifted = max(step.floor_bytes, budget + step.base_bytes)
        if out_budgets and out_budgets[-1] == shifted:
            out_makespans[-1] = makespan  # several chain optima fit under the floor: the best one is reached there
        else:
            out_budgets.append(shifted)
            out_makespans.append(makespan)
    return out_budgets, out_makespans


def _distinct_optima(
    by_slots: np.ndarray, slot_bytes: int, peak_bytes: int, include_peak: bool
) -> tuple[list[int], list[float]]:
    """Budgets (bytes, up to ``peak_bytes``) where the optimum first drops, and the optimum there."""
    budgets: list[int] = []
    makespans: list[float] = []
    for count in np.flatnonzero(np.isfinite(by_slots)):
        budget, value = int(count) * slot_bytes, float(by_slots[count])
        if budget > peak_bytes or (budget == peak_bytes and not include_peak):
            break
        if not makespans or value < makespans[-1] * (1 - _RELATIVE_STEP):
            budgets.append(budget)
            makespans.append(value)
    return budgets, makespans


def algorithm_points(chain: Chain, slots: int = DEFAULT_SLOTS, sweep: int = 12) -> pd.DataFrame:
    """Memory-vs-time points of every algorithm, for the Pareto plot.

    store_all and sqrt give one point each, periodic one per segment count (2..L), revolve and rotor
    ``sweep`` budgets evenly spaced from their minimum feasible budget to store-all's peak; offload as many,
    read from one table on store-all's grid, for chains of at most ``OFFLOAD_POINTS_MAX_STAGES`` stages
    whose link is usable (its ``params`` carry ``host_peak_bytes``); and binomial up to ``sweep`` snapshot
    counts evenly spaced from the fewest to L (budget: its memory bound); selective, when some stage has
    recomputation options (``Stage.options``), ``sweep`` budgets as rotor's; for a chain from a trace (weight
    costs), weight streaming as ``"offload+weights"`` (:mod:`planner.weight_points`). ``peak_bytes``
    and ``makespan_ms`` are simulated; ``budget_bytes`` is the budget solved for (the peak itself for the
    algorithms that take no budget); ``params`` is a JSON string. For a chain with step costs, budgets and
    peaks are the whole step's (:meth:`planner.step.StepCosts.step_peak_bytes` of the simulated chain peak).

    Returns:
        A DataFrame with columns ``POINT_COLUMNS``.
    """
    rows: list[tuple] = []
    step = chain.step

    def whole(chain_bytes: int) -> int:
        return int(chain_bytes) if step is None else step.step_peak_bytes(int(chain_bytes))

    def add(algorithm: str, budget: int, ops: tuple, params: dict) -> None:
        peak, makespan = predict(chain, ops)
        rows.append((algorithm, int(budget), whole(peak), makespan, json.dumps(params, sort_keys=True)))

    all_ops = store_all.store_all_ops(chain)
    add("store_all", whole(store_all.store_all_peak_bytes(chain)), all_ops, {})
    for segments, peak, _ in periodic.candidates(chain)[1:]:
        add("periodic", whole(peak), periodic.periodic_ops(chain, segments), {"segments": segments})
    sqrt_ops = sqrt.sqrt_ops(chain)
    add("sqrt", whole(predict(chain, sqrt_ops)[0]), sqrt_ops, {"segment_length": sqrt.segment_length(chain)})
    for algorithm in ("revolve", "rotor", *(("selective",) if has_options(chain) else ())):
        try:
            front = pareto_front(chain, algorithm, slots)
        except InfeasibleBudgetError:  # revolve can find no schedule at any budget (a^l too large to keep)
            continue
        for budget in np.unique(np.linspace(front.min_feasible_bytes, front.max_budget_bytes, sweep).astype(np.int64)):
            schedule = front.schedule_at(int(budget))
            add(algorithm, int(budget), schedule.ops, {"slots": slots})
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
