"""Selective recomputation: ROTOR's persistent DP where each recorded forward picks a recomputation option.

Each stage may offer options besides keeping everything (:mod:`planner.model.stage_option`, built from op records
by :mod:`planner.discovery.option_builder`): option ``k`` keeps a-bar_k^s <= a-bar^s, and ``B(s)`` first recomputes
what it dropped, ``r_k`` more milliseconds. The recurrence is rotor's (``rotor.py``, written plainly in
``reference/selective.py``) with the ``F_all(s)`` branch taken at its best option (Rockmate-style):

    min over k of  u_f^s + C(s+1, t, m - abar_k^s) + u_b^s + r_k^s

feasible when ``F_all(s)`` fits beside ``delta^t`` holding a-bar_k^s, and ``B(s)`` (with its recomputation)
fits with the full a-bar^s. A chain without options gives rotor's table exactly. The loss stage's chunked
options (the head and its cross-entropy in chunks, :mod:`planner.discovery.loss_options`) change only the
base case ``C(L+1, L+1, m)``: :mod:`planner.solvers.loss_choice` takes the best of the DP over them. The table is filled by
``rotor_fill.fill`` with an :class:`~planner.solvers.option_grid.OptionGrid`; the schedule is rebuilt
from it apart, each budget solved on its own grid as rotor's (``budget_grid.py``); the fallback to binomial
checkpointing (no options) when the table would exceed ``rotor.MAX_TABLE_BYTES`` is
:mod:`planner.solvers.handover`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from memprof.units import format_bytes
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import simulate
from planner.solvers import loss_choice, rotor_fill
from planner.solvers.budget_grid import Minimum, exact_floor, lowest_budget, plan_on_own_grid
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS, DiscreteChain, discretize
from planner.solvers.option_grid import OptionGrid
from planner.solvers.rotor_fill import Arrays
from planner.solvers.store_all import store_all_ops, store_all_peak_bytes

NAME = "selective"
_INF = np.float32(np.inf)


@dataclass(frozen=True, eq=False)
class SelectiveTable:
    """The selective DP's table for one chain.

    Attributes:
        grid: the chain in slots.
        options: the stages' options in slots.
        cost: float32 ``(L+1, L+1, slots+1)``: ``cost[t-s, s-1, m]`` is ``C(s, t, m)``, as rotor's.
        store_all_bytes: store-all's exact peak; budgets at or above it get store-all.
    """

    grid: DiscreteChain
    options: OptionGrid
    cost: np.ndarray
    store_all_bytes: int

    def root_makespans(self) -> np.ndarray:
        """Optimal makespan (ms, float64) for each budget of ``b`` slots, ``b`` in 0..slots (inf: infeasible)."""
        grid = self.grid
        out = np.full(grid.slots + 1, np.inf)
        a0 = int(grid.a[0])
        if a0 <= grid.slots:
            out[a0:] = self.cost[grid.top - 1, 0, : grid.slots + 1 - a0]
        return out

    def min_feasible_bytes(self) -> int:
        """The smallest budget with a schedule on this grid, store-all's peak at most."""
        finite = np.flatnonzero(np.isfinite(self.root_makespans()))
        return self.store_all_bytes if not finite.size else min(self.grid.to_bytes(int(finite[0])), self.store_all_bytes)


def compute_table(chain: Chain, slots: int = DEFAULT_SLOTS, *, grid: DiscreteChain | None = None) -> SelectiveTable:
    """Fills the selective DP for every memory 0..slots (``grid`` overrides ``slots``).

    Raises:
        ValueError: bad slot count.
    """
    grid = grid if grid is not None else discretize(chain, slots)
    options = OptionGrid.of_grid(grid)
    return SelectiveTable(grid, options, rotor_fill.fill(grid, "rotor", options), store_all_peak_bytes(chain))


def _choose(table: SelectiveTable, arr: Arrays, s: int, t: int, m: int) -> tuple[int, int]:
    """The first operation at ``(s, t, m)``: ``(0, k)`` for ``F_all(s)`` with option ``k``, ``(split, 0)`` for
    ``F_ck(s)`` up to ``split - 1``. Recomputes the candidates from the table, as ``rotor._choose``."""
    cost, options = table.cost, table.options
    d = t - s
    best_value, best = _INF, (-1, 0)
    for k in range(options.size):
        shift = int(options.abar[k, s])
        if m >= int(arr.need_option(options, k, np.array([s]), np.array([t]))[0]) and m >= shift:
            value = arr.both[s] + options.recompute_ms[k, s] + cost[d - 1, s, m - shift]
            if value < best_value:
                best_value, best = value, (0, k)
    inner = int(arr.hop[s + 1 : t].max()) if d >= 2 else np.iinfo(np.int64).min
    if m >= arr.delta[t] + max(int(arr.a[s] + arr.of[s]), inner):
        splits = np.arange(s + 1, t + 1)
        sub = m - arr.a[splits - 1]
        left = np.where(sub >= 0, cost[t - splits, splits - 1, np.maximum(sub, 0)], _INF) + arr.prefix[splits - 1]
        values = left + cost[splits - 1 - s, s - 1, m]
        j = int(np.argmin(values))
        value = values[j] - arr.prefix[s - 1]
        if value < best_value:
            best_value, best = value, (int(splits[j]), 0)
    if not np.isfinite(best_value):
        raise AssertionError(f"rebuild reached an infeasible state C({s}, {t}, {m}); the table is inconsistent")
    return best


def rebuild(table: SelectiveTable, budget_bytes: int) -> tuple[Op, ...]:
    """The optimal persistent schedule with options within ``budget_bytes``, read from the table.

    Raises:
        InfeasibleBudgetError: no schedule fits (the message names the minimum feasible budget).
    """
    grid = table.grid
    if budget_bytes >= table.store_all_bytes:
        return store_all_ops(grid.chain)
    m = min(grid.budget_slots(budget_bytes), grid.slots) - int(grid.a[0])
    if m < 0 or not np.isfinite(table.cost[grid.top - 1, 0, m]):
        detail = f"{grid.slots} slots of {format_bytes(grid.slot_bytes)}"
        raise infeasible(NAME, int(budget_bytes), table.min_feasible_bytes(), detail)
    arr = Arrays.of_grid(grid)
    ops: list[Op] = []
    stack: list[Op | tuple[int, int, int]] = [(1, grid.top, m)]
    while stack:
        item = stack.pop()
        if isinstance(item, Op):
            ops.append(item)
            continue
        s, t, m = item
        if s == t:  # an option only adds time when nothing runs between F_all(s) and B(s)
            ops += [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
            continue
        split, option = _choose(table, arr, s, t, m)
        if split == 0:
            ops.append(Op(OpKind.F_ALL, s, option))
            stack += [Op(OpKind.B, s), (s + 1, t, m - int(table.options.abar[option, s]))]
        else:
            ops += [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
            stack += [(s, split - 1, m), (split, t, m - int(arr.a[split - 1]))]
    return tuple(ops)


def threshold_bytes(grid: DiscreteChain, store_all_bytes: int) -> int:
    """The smallest budget with a schedule on ``grid`` (from the feasibility DP), store-all's peak at most."""
    root = int(grid.a[0]) + rotor_fill.least_memory(grid, "rotor", OptionGrid.of_grid(grid))[1, grid.top]
    return store_all_bytes if root > grid.slots else min(grid.to_bytes(int(root)), store_all_bytes)


def minimum(chain: Chain, slots: int = DEFAULT_SLOTS) -> Minimum | None:
    """The minimum feasible budget with each budget on its own grid (see :mod:`budget_grid`)."""
    top = store_all_peak_bytes(chain)

    def threshold_on(count: int, reference: int) -> int:
        return threshold_bytes(discretize(chain, count, reference), top)

    return lowest_budget(partial(threshold_on, slots), top, slots, exact_floor(threshold_on, top))


def min_budget_bytes(chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
    """The smallest budget for which :func:`plan` finds a schedule (each budget on its own grid)."""
    if loss_choice.has_loss_options(chain):
        return loss_choice.min_budget_bytes(chain, partial(_min_fixed, slots=slots))
    return _min_fixed(chain, slots)


def _min_fixed(chain: Chain, slots: int) -> int:
    found = minimum(chain, slots)
    assert found is not None, "store-all's peak always has a schedule"
    return found.budget_bytes


def plan(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
    """The optimal persistent schedule with recomputation options within ``budget_bytes``, on its own grid
    (the loss stage's chunked options included).

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one (named).
    """
    if loss_choice.has_loss_options(chain):
        return loss_choice.plan(NAME, chain, budget_bytes, partial(_plan_fixed, slots=slots),
                                partial(_min_fixed, slots=slots), _makespan_ms)
    return _plan_fixed(chain, budget_bytes, slots)


def _makespan_ms(chain: Chain, ops: tuple[Op, ...]) -> float:
    """The simulator's makespan: the judge of the loss's options, as of every schedule."""
    return simulate(chain, ops).makespan_ms


def _plan_fixed(chain: Chain, budget_bytes: int, slots: int) -> Plan:
    """:func:`plan` on a chain whose loss stage has no chunked options to choose from."""
    def solve_on(reference: int, budget: int) -> Plan:
        table = compute_table(chain, grid=discretize(chain, slots, reference))
        return Plan(rebuild(table, budget), ScheduleParams(slots=slots, slot_bytes=table.grid.slot_bytes))

    return plan_on_own_grid(NAME, budget_bytes, store_all_peak_bytes(chain), solve_on,
                            partial(minimum, chain, slots), f"{slots} slots spanning each budget")
