"""Memory-vs-time trade-offs: the Pareto front of one DP, and the points of every algorithm.

One DP solve for the largest useful budget (store-all's peak) yields the optimum of every smaller
budget, since the table holds every memory 0..slots. :class:`ParetoFront` keeps that table, so the
dashboard's budget slider calls :meth:`ParetoFront.schedule_at`, which only reads a schedule out of it.

For a chain built from a trace (``chain.step`` set) every budget and peak here is the whole training
step's memory, as in :func:`planner.solvers.dispatch.solve`: the table is solved on the chain's own grid once, and its
budgets are converted with :class:`planner.model.step.StepCosts` (a chain budget ``m`` is the step budget
``max(floor, m + base)``, and a step budget ``B`` leaves the chain ``B - base``).

A chain with carried tensors (skips, :mod:`planner.solvers.carried_fit`) holds memory the table does not count: its
front keeps the table's optima at their peaks with that memory counted, and the schedule of each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.errors import InfeasibleBudgetError, UnknownAlgorithmError
from planner.model.chain import Chain
from planner.model.schedule import Op, Schedule
from planner.model.schedule_params import ScheduleParams
from planner.model.step import StepCosts, step_infeasible
from planner.simulation.simulator import predict
from planner.solvers import loss_choice, rotor, rotor_optimal, selective, store_all
from planner.solvers.common import infeasible
from planner.solvers.discretize import DEFAULT_SLOTS

FRONT_ALGORITHMS = ("rotor", "revolve", "rotor_optimal", "selective")
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
        plans: for a chain with carried tensors, the schedule of each point (``budgets_bytes`` are then their
            peaks with the carried memory counted); empty otherwise, when schedules are read from the table.
        low_ops: the schedule of the first point when the table's grid cannot reach it: ``solve`` at
            ``min_feasible_budget``, which searches every budget's own grid (so the front starts where the CLI
            says the minimum is); empty when the table reaches it.
        low_until_bytes: the budget from which the table's own schedules take over from ``low_ops``.
    """

    chain: Chain
    algorithm: str
    slots: int
    budgets_bytes: np.ndarray
    makespans_ms: np.ndarray
    min_feasible_bytes: int
    max_budget_bytes: int
    table: rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable
    plans: tuple[tuple[Op, ...], ...] = ()
    low_ops: tuple[Op, ...] = ()
    low_until_bytes: int = 0

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
        if budget < self.min_feasible_bytes:
            raise self._infeasible(budget)
        if self.low_ops and budget < self.low_until_bytes:
            ops = self.low_ops
        elif self.plans:
            position = int(np.searchsorted(self.budgets_bytes, budget, side="right")) - 1
            if position < 0:
                raise self._infeasible(budget)
            ops = self.plans[position]
        else:
            ops = _rebuild(self.table, self.chain_budget_bytes(budget))
        peak, makespan = peak_and_makespan(self.chain, ops)
        params = ScheduleParams(slots=self.slots, slot_bytes=self.table.grid.slot_bytes)
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


def _rebuild(table: rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable,
             budget_bytes: int) -> tuple[Op, ...]:
    """The optimal operations within the chain budget ``budget_bytes``, read from ``table``."""
    if isinstance(table, rotor.RotorTable):
        return rotor.rebuild(table, budget_bytes)
    if isinstance(table, selective.SelectiveTable):
        return selective.rebuild(table, budget_bytes)
    return rotor_optimal.rebuild(table, budget_bytes)


def peak_and_makespan(chain: Chain, ops: tuple[Op, ...]) -> tuple[int, float]:
    """The chain's simulated peak (carried tensors counted) and makespan of ``ops``."""
    return predict(chain, ops)


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
    if algorithm == "selective" and loss_choice.has_loss_options(chain):
        return _over_loss_options(chain, slots)
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
    plans: list[tuple[Op, ...]] = []
    if chain.carried:
        # revolve's front reads its table even at store-all's peak; the others answer it with store-all
        budgets, makespans, plans = _with_carried(chain, table, budgets, None if algorithm == "revolve" else peak)
        peak = budgets[-1]
    if chain.step is not None:
        budgets, makespans, kept = _in_step_terms(chain.step, budgets, makespans)
        plans = [plans[i] for i in kept] if plans else plans
        peak = chain.step.step_peak_bytes(peak)
    low_ops: tuple[Op, ...] = ()
    low_until = budgets[0]
    low = _below_the_grid(chain, algorithm, slots, budgets[0])
    if low is not None:
        assert low.predicted_makespan_ms is not None and low.budget_bytes is not None
        if low.predicted_makespan_ms <= makespans[0] * (1 + _RELATIVE_STEP):  # as fast as the table's first point
            budgets, makespans, plans = budgets[1:], makespans[1:], plans[1:]
        budgets, makespans = [int(low.budget_bytes), *budgets], [low.predicted_makespan_ms, *makespans]
        if plans:
            plans = [low.ops, *plans]
        else:
            low_ops = low.ops
    return ParetoFront(chain, algorithm, slots, np.array(budgets, dtype=np.int64), np.array(makespans),
                       budgets[0], peak, table, tuple(plans), low_ops, low_until)


def _over_loss_options(chain: Chain, slots: int) -> ParetoFront:
    """The selective front of a chain whose loss stage has chunked options: the lower envelope of the fronts
    of the chain with each option (:mod:`planner.solvers.loss_choice`), each point's schedule stored."""
    top = chain.length + 1
    points = []
    for option in loss_choice.chunk_choices(chain):
        front = pareto_front(loss_choice.variant(chain, option), "selective", slots)
        for budget in front.budgets_bytes:
            ops = loss_choice.with_loss_option(front.schedule_at(int(budget)).ops, top, option)
            points.append((int(budget), *peak_and_makespan(chain, ops)[1:], ops, front.table))
    points.sort(key=lambda point: (point[0], point[1]))
    kept: list[tuple[int, float, tuple[Op, ...], rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable]] = []
    for point in points:
        if not kept or point[1] < kept[-1][1] * (1 - _RELATIVE_STEP):
            kept.append(point)
    peak = store_all.store_all_peak_bytes(chain)
    top_bytes = peak if chain.step is None else chain.step.step_peak_bytes(peak)
    return ParetoFront(chain, "selective", slots, np.array([p[0] for p in kept], dtype=np.int64),
                       np.array([p[1] for p in kept]), kept[0][0], max(top_bytes, kept[-1][0]), kept[0][3],
                       tuple(p[2] for p in kept))


def _below_the_grid(chain: Chain, algorithm: str, slots: int, front_min_bytes: int) -> Schedule | None:
    """``solve``'s schedule at ``min_feasible_budget`` when that is below the table's first point (``None``
    otherwise): store-all's grid rounds each size up by up to a slot of store-all's peak / slots, a budget's own
    grid by a slot of the budget / slots."""
    from planner.solvers.dispatch import (  # solve's module reads the solvers this one reads
        min_feasible_budget,
        solve,
    )

    lowest = min_feasible_budget(chain, algorithm, slots)
    if lowest >= front_min_bytes:
        return None
    return solve(chain, lowest, algorithm, slots)


def _with_carried(chain: Chain, table: rotor.RotorTable | rotor_optimal.OptimalTable | selective.SelectiveTable,
                  budgets: list[int], store_all_peak: int | None) -> tuple[list[int], list[float], list[tuple[Op, ...]]]:
    """The table's optima at their peaks with the carried tensors counted, those no cheaper point beats
    (``store_all_peak``: the budget from which the front's schedule is store-all; ``None``: never)."""
    points = []
    for budget in budgets:
        at_top = store_all_peak is not None and budget >= store_all_peak
        ops = store_all.store_all_ops(chain) if at_top else _rebuild(table, budget)
        points.append((*peak_and_makespan(chain, ops), ops))
    points.sort(key=lambda point: (point[0], point[1]))
    out_budgets: list[int] = []
    out_makespans: list[float] = []
    plans: list[tuple[Op, ...]] = []
    for peak, makespan, ops in points:
        if not out_makespans or makespan < out_makespans[-1] * (1 - _RELATIVE_STEP):
            out_budgets.append(peak)
            out_makespans.append(makespan)
            plans.append(ops)
    return out_budgets, out_makespans, plans


def _in_step_terms(step: StepCosts, budgets: list[int],
                   makespans: list[float]) -> tuple[list[int], list[float], list[int]]:
    """Chain budgets as whole-step budgets: shifted by ``base``, clipped at the floor (the best optimum kept).

    Returns the step budgets, their makespans and the index of each kept optimum among the given ones.
    """
    out_budgets: list[int] = []
    out_makespans: list[float] = []
    kept: list[int] = []
    for index, (budget, makespan) in enumerate(zip(budgets, makespans)):
        shifted = max(step.floor_bytes, budget + step.base_bytes)
        if out_budgets and out_budgets[-1] == shifted:
            out_makespans[-1] = makespan  # several chain optima fit under the floor: the best one is reached there
            kept[-1] = index
        else:
            out_budgets.append(shifted)
            out_makespans.append(makespan)
            kept.append(index)
    return out_budgets, out_makespans, kept


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
