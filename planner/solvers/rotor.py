"""ROTOR's persistent dynamic program (ROTOR paper, Theorem 4.8, Algorithms 3-4), vectorised with NumPy.

``C(s, t, m)`` is the fastest memory-persistent way to go from ``a^{s-1}`` and ``delta^t`` to
``delta^{s-1}`` within ``m`` memory slots, ``a^{s-1}`` not counted (see ``reference/rotor.py`` for the
recurrence written plainly). The table holds ``C`` for every ``(s, t)`` and every ``m`` in 0..slots, so
one computation answers every budget of its grid: :func:`rebuild` reads a schedule out of it (the Pareto
front keeps one table on store-all's grid). :func:`plan` solves each budget on its own grid, ``slots``
slots spanning the budget (see ``budget_grid.py``).

The fill is vectorised and prunes work that cannot change any value (see ``rotor_fill.py``).

Values are float32 to halve the table; a rebuilt schedule's makespan is recomputed exactly by the
simulator.

The fill keeps two tables of ``(L+1)^2 * (slots+1)`` float32 (the costs and their shifted copy): 442 MiB
at L = 339 with 500 slots. A chain whose tables would exceed :data:`MAX_TABLE_BYTES` goes to binomial
checkpointing instead (``binomial.py``, no table), with a :class:`~planner.errors.FallbackWarning`: the turn is
taken in :mod:`planner.solvers.handover`, for every caller of :func:`planner.solvers.dispatch.solver`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from memprof.units import format_bytes
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.solvers import rotor_fill
from planner.solvers.budget_grid import Minimum, exact_floor, lowest_budget, plan_on_own_grid
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS, DiscreteChain, discretize
from planner.solvers.rotor_fill import Arrays
from planner.solvers.store_all import store_all_ops, store_all_peak_bytes

MODES = ("rotor", "revolve")
MAX_TABLE_BYTES = 1 << 30
"""The most memory rotor's tables may take (1 GiB, about L = 517 at 500 slots); above it :func:`plan` falls
back to binomial. A module attribute: set ``planner.solvers.rotor.MAX_TABLE_BYTES`` to change it."""
_F32 = np.float32
_INF = _F32(np.inf)


@dataclass(frozen=True, eq=False)
class RotorTable:
    """The persistent DP's table for one chain.

    Attributes:
        grid: the chain in slots.
        cost: float32 array ``(L+1, L+1, slots+1)`` by sub-chain length: ``cost[t-s, s-1, m]`` is
            ``C(s, t, m)`` (inf when infeasible); entries with ``t > L+1`` are undefined (see :meth:`row`).
        mode: ``"rotor"`` (any persistent sequence) or ``"revolve"`` (``F_all`` only right before ``B``).
        store_all_bytes: store-all's exact peak; in rotor mode budgets at or above it get store-all.
    """

    grid: DiscreteChain
    cost: np.ndarray
    mode: str
    store_all_bytes: int

    def row(self, s: int, t: int) -> np.ndarray:
        """``C(s, t, m)`` for every ``m`` in 0..slots (a view, float32)."""
        if not 1 <= s <= t <= self.grid.top:
            raise IndexError(f"C(s, t) exists for 1 <= s <= t <= {self.grid.top}, found s={s}, t={t}")
        return self.cost[t - s, s - 1]

    @property
    def table_bytes(self) -> int:
        """Memory held by the cost table."""
        return int(self.cost.nbytes)

    def root_makespans(self) -> np.ndarray:
        """Optimal makespan (ms, float64) for each budget of ``b`` slots, ``b`` in 0..slots (inf: infeasible)."""
        grid = self.grid
        out = np.full(grid.slots + 1, np.inf)
        a0 = int(grid.a[0])
        if a0 <= grid.slots:
            out[a0:] = self.cost[grid.top - 1, 0, : grid.slots + 1 - a0]
        return out

    def min_feasible_bytes(self) -> int | None:
        """The smallest budget with a schedule on this grid (``None``: none up to ``slots`` slots).

        In rotor mode store-all, whose exact peak needs no rounding, caps it.
        """
        finite = np.flatnonzero(np.isfinite(self.root_makespans()))
        found = self.grid.to_bytes(int(finite[0])) if finite.size else None
        if self.mode == "rotor":
            return self.store_all_bytes if found is None else min(found, self.store_all_bytes)
        return found


def compute_table(
    chain: Chain, slots: int = DEFAULT_SLOTS, *, mode: str = "rotor", grid: DiscreteChain | None = None
) -> RotorTable:
    """Fills the persistent DP for every memory 0..slots.

    Args:
        chain: the chain.
        slots: the number of memory slots spanning store-all's peak.
        mode: ``"rotor"`` or ``"revolve"``.
        grid: a ready discretisation of ``chain`` (overrides ``slots``).

    Raises:
        ValueError: unknown mode or bad slot count.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, found {mode!r}")
    grid = grid if grid is not None else discretize(chain, slots)
    return RotorTable(grid, rotor_fill.fill(grid, mode), mode, store_all_peak_bytes(chain))


def _choose(table: RotorTable, arr: Arrays, s: int, t: int, m: int) -> int:
    """The first operation's choice at ``(s, t, m)``: 0 for ``F_all(s)``, else the split ``s'`` of ``F_ck``.

    Recomputes the candidates with the same float32 operations as :func:`_fill`, so the minimum found is
    the one stored in the table.
    """
    cost = table.cost
    d = t - s
    best_value, best_choice = _INF, -1
    if table.mode == "rotor" and m >= int(arr.need_all(np.array([s]), np.array([t]))[0]) and m >= arr.abar[s]:
        best_value, best_choice = arr.both[s] + cost[d - 1, s, m - arr.abar[s]], 0
    inner = int(arr.hop[s + 1 : t].max()) if d >= 2 else np.iinfo(np.int64).min
    if m >= arr.delta[t] + max(int(arr.a[s] + arr.of[s]), inner):
        splits = np.arange(s + 1, t + 1)
        sub = m - arr.a[splits - 1]
        left = np.where(sub >= 0, cost[t - splits, splits - 1, np.maximum(sub, 0)], _INF) + arr.prefix[splits - 1]
        values = left + cost[splits - 1 - s, s - 1, m]
        k = int(np.argmin(values))
        value = values[k] - arr.prefix[s - 1]
        if value < best_value:
            best_value, best_choice = value, int(splits[k])
    if not np.isfinite(best_value):
        raise AssertionError(f"rebuild reached an infeasible state C({s}, {t}, {m}); the table is inconsistent")
    return best_choice


def rebuild(table: RotorTable, budget_bytes: int) -> tuple[Op, ...]:
    """The optimal persistent schedule within ``budget_bytes``, read from the table (no new DP).

    In rotor mode, budgets at or above store-all's peak get store-all (the rounding of sizes up to slots
    could otherwise miss it at the top of the grid).

    Raises:
        InfeasibleBudgetError: no schedule fits (the message names the minimum feasible budget).
    """
    grid = table.grid
    if table.mode == "rotor" and budget_bytes >= table.store_all_bytes:
        return store_all_ops(grid.chain)
    m = min(grid.budget_slots(budget_bytes), grid.slots) - int(grid.a[0])
    if m < 0 or not np.isfinite(table.cost[grid.top - 1, 0, m]):
        detail = f"{grid.slots} slots of {format_bytes(grid.slot_bytes)}"
        raise infeasible(table.mode, int(budget_bytes), table.min_feasible_bytes(), detail)
    arr = Arrays.of_grid(grid)
    ops: list[Op] = []
    stack: list[Op | tuple[int, int, int]] = [(1, grid.top, m)]
    while stack:
        item = stack.pop()
        if isinstance(item, Op):
            ops.append(item)
            continue
        s, t, m = item
        if s == t:
            ops += [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
            continue
        split = _choose(table, arr, s, t, m)
        if split == 0:
            ops.append(Op(OpKind.F_ALL, s))
            stack += [Op(OpKind.B, s), (s + 1, t, m - int(arr.abar[s]))]
        else:
            ops += [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
            stack += [(s, split - 1, m), (split, t, m - int(arr.a[split - 1]))]
    return tuple(ops)


def threshold_bytes(grid: DiscreteChain, mode: str, store_all_bytes: int) -> int | None:
    """The smallest budget with a schedule on ``grid``: :meth:`RotorTable.min_feasible_bytes`, without the table.

    From :func:`rotor_fill.least_memory`, the DP's feasibility alone; in rotor mode store-all caps it.
    """
    root = int(grid.a[0]) + rotor_fill.least_memory(grid, mode)[1, grid.top]
    found = grid.to_bytes(int(root)) if root <= grid.slots else None
    if mode == "rotor":
        return store_all_bytes if found is None else min(found, store_all_bytes)
    return found


def minimum(chain: Chain, slots: int = DEFAULT_SLOTS, mode: str = "rotor") -> Minimum | None:
    """The minimum feasible budget with each budget on its own grid (see :mod:`budget_grid`); ``None``: none."""
    top = store_all_peak_bytes(chain)

    def threshold_on(count: int, reference: int) -> int | None:
        return threshold_bytes(discretize(chain, count, reference), mode, top)

    return lowest_budget(partial(threshold_on, slots), top, slots, exact_floor(threshold_on, top))


def table_bytes_estimate(stages: int, slots: int) -> int:
    """Bytes of the fill's two float32 tables for ``stages`` stages plus the loss and ``slots`` slots."""
    top = stages + 1
    return 2 * top * top * (slots + 1) * np.dtype(_F32).itemsize


def min_budget_bytes(chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
    """The smallest budget for which :func:`plan` finds a schedule (each budget on its own grid)."""
    found = minimum(chain, slots)
    assert found is not None, "store-all's peak always has a schedule"
    return found.budget_bytes


def plan_mode(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS, mode: str = "rotor") -> Plan:
    """The optimal persistent (``mode="revolve"``: revolve) schedule within ``budget_bytes``, on the budget's
    own grid: ``slots`` slots spanning the budget, capped at store-all's peak.

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one (named).
    """
    def solve_on(reference: int, budget: int) -> Plan:
        table = compute_table(chain, mode=mode, grid=discretize(chain, slots, reference))
        return Plan(rebuild(table, budget), ScheduleParams(slots=slots, slot_bytes=table.grid.slot_bytes))

    return plan_on_own_grid(mode, budget_bytes, store_all_peak_bytes(chain), solve_on,
                            partial(minimum, chain, slots, mode), f"{slots} slots spanning each budget")


def plan(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
    """The optimal persistent schedule within ``budget_bytes``, on the budget's own grid (whatever the tables'
    size: :mod:`planner.solvers.handover` decides when binomial runs instead).

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one (named).
    """
    return plan_mode(chain, budget_bytes, slots, "rotor")


def rebuild_part(table: RotorTable, s: int, t: int, m: int) -> list[Op]:
    """The optimal persistent sequence of the sub-chain ``s..t`` within ``m`` slots, ``a^{s-1}`` not counted:
    ``C(s, t, m)``'s schedule (for solvers that place sub-chains of their own, such as ``offload``).

    Raises:
        AssertionError: ``C(s, t, m)`` is infinite (the caller asked for a schedule the table says cannot be).
    """
    arr = Arrays.of_grid(table.grid)
    ops: list[Op] = []
    stack: list[Op | tuple[int, int, int]] = [(s, t, m)]
    while stack:
        item = stack.pop()
        if isinstance(item, Op):
            ops.append(item)
            continue
        s, t, m = item
        if s == t:
            if not np.isfinite(table.cost[0, s - 1, m]):
                raise AssertionError(f"rebuild reached an infeasible state C({s}, {t}, {m})")
            ops += [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
            continue
        split = _choose(table, arr, s, t, m)
        if split == 0:
            ops.append(Op(OpKind.F_ALL, s))
            stack += [Op(OpKind.B, s), (s + 1, t, m - int(arr.abar[s]))]
        else:
            ops += [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
            stack += [(s, split - 1, m), (split, t, m - int(arr.a[split - 1]))]
    return ops
