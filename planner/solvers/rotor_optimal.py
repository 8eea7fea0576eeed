"""ROTOR's optimal weak-persistent dynamic program (ROTOR paper, Theorem 4.7, Algorithms 1-2).

``C(s, t, l, m)`` (see ``reference/rotor_optimal.py`` for the recurrence written plainly; ``l`` is the
paper's ell, ``last`` in the code): with the
floating checkpoint ``a^{s-1}`` (not counted) and ``delta^l`` held, run ``B(l) .. B(t)`` within ``m``
slots. The ``F_ck`` case minimises over a split ``s'`` and an end ``t'`` at once, which costs ``O(L^2)``
per entry; it is factored through

    G(s, t', l, m) = min over s < s' <= t' of  U(s..s'-1) + C(s', t', l, m - a^{s'-1})
    F_ck case      = min over t < t' <= l  of  G(s, t', l, m) + C(s, t, t'-1, m)

so each entry costs ``O(L)``: ``O(L^4 * slots)`` in all, every step vectorised over the memory axis.
That is fine up to a few dozen stages; ``rotor`` (persistent, ``O(L^3 * slots)``) is the practical
choice beyond. Values are float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from memprof.units import format_bytes
from planner.errors import TableTooLargeError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.solvers.budget_grid import Minimum, exact_floor, lowest_budget, plan_on_own_grid
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS, DiscreteChain, discretize
from planner.solvers.store_all import store_all_ops, store_all_peak_bytes

_Key = tuple[int, int, int]
MAX_TABLE_BYTES = 1 << 30


def table_bytes_estimate(stages: int, slots: int) -> int:
    """Bytes of the three float64 tables for ``stages`` stages plus the loss: one row per ``(s, t, l)``."""
    top = stages + 1
    return 3 * (top * (top + 1) * (top + 2) // 6) * (slots + 1) * 8


def check_table_size(stages: int, slots: int) -> None:
    """Raises :class:`TableTooLargeError` when the tables would take more than ``MAX_TABLE_BYTES``."""
    needed = table_bytes_estimate(stages, slots)
    if needed > MAX_TABLE_BYTES:
        raise TableTooLargeError(
            f"rotor_optimal needs about {format_bytes(needed)} of tables for {stages} stages and "
            f"{slots} slots (they grow as L^3 * slots; at most {format_bytes(MAX_TABLE_BYTES)} allowed); "
            f"use rotor, whose schedules are the same on most chains, or fewer slots"
        )


@dataclass(frozen=True, eq=False)
class OptimalTable:
    """The weak-persistent DP's tables for one chain.

    Attributes:
        grid: the chain in slots.
        cost: ``(s, t, l) -> C(s, t, l, .)`` over memory 0..slots (float64, inf when infeasible).
        right: ``(s, t', l) -> G(s, t', l, .)``, the factored ``F_ck`` case.
        by_end: ``(s, t, l) -> C(s, t, l, m - a^{s-1}) + U(s-1)``, kept so rebuilds need no recomputation.
        store_all_bytes: store-all's exact peak; budgets at or above it get store-all.
    """

    grid: DiscreteChain
    cost: dict[_Key, np.ndarray]
    right: dict[_Key, np.ndarray]
    by_end: dict[_Key, np.ndarray]
    store_all_bytes: int

    def root_makespans(self) -> np.ndarray:
        """Optimal makespan (ms) for each budget of ``b`` slots, ``b`` in 0..slots (inf: infeasible)."""
        grid = self.grid
        out = np.full(grid.slots + 1, np.inf)
        a0 = int(grid.a[0])
        if a0 <= grid.slots:
            out[a0:] = self.cost[(1, 1, grid.top)][: grid.slots + 1 - a0]
        return out

    def min_feasible_bytes(self) -> int:
        """The smallest budget with a schedule on this grid, capped by store-all's exact peak."""
        finite = np.flatnonzero(np.isfinite(self.root_makespans()))
        found = self.grid.to_bytes(int(finite[0])) if finite.size else self.store_all_bytes
        return min(found, self.store_all_bytes)


def _hops(grid: DiscreteChain) -> np.ndarray:
    """``hop[j] = a^{j-1} + a^j + o_f^j``: the memory of ``F_none(j)`` (0 at index 0)."""
    hop = np.zeros_like(grid.a)
    hop[1:] = grid.a[:-1] + grid.a[1:] + grid.forward_overhead[1:]
    return hop


def _split_needs(grid: DiscreteChain, hop: np.ndarray, s: int, last: int) -> np.ndarray:
    """For ``s' = s+1 .. l``: memory of ``F_ck(s) F_none(s+1) .. F_none(s'-1)`` beside ``delta^l``."""
    inner = np.maximum.accumulate(np.concatenate([[0], hop[s + 1 : last]]))
    return grid.delta[last] + np.maximum(grid.a[s] + grid.forward_overhead[s], inner)


class _Filler:
    """Fills the tables one ``(s, l)`` pair at a time, by increasing ``l - s``."""

    def __init__(self, grid: DiscreteChain) -> None:
        self.grid, self.width = grid, grid.slots + 1
        self.memory = np.arange(self.width)
        self.a, self.abar, self.delta = grid.a, grid.abar, grid.delta
        self.of, self.ob = grid.forward_overhead, grid.backward_overhead
        self.uf, self.ub = grid.forward_ms, grid.backward_ms
        self.prefix = np.concatenate([[0.0], np.cumsum(grid.forward_ms[1:])])
        self.hop = _hops(grid)
        self.cost: dict[_Key, np.ndarray] = {}
        self.right: dict[_Key, np.ndarray] = {}
        self.by_end: dict[_Key, np.ndarray] = {}  # C(s', t', l, m - a^{s'-1}) + U(s'-1)

    def shift(self, row: np.ndarray, by: int) -> np.ndarray:
        """``row[m - by]``: inf below 0, the table's top above it."""
        index = self.memory - by
        out = row[np.clip(index, 0, self.width - 1)]
        out[index < 0] = np.inf
        return out

    def split_needs(self, s: int, last: int) -> np.ndarray:
        """For ``s' = s+1 .. l``: memory of ``F_ck(s) F_none(s+1) .. F_none(s'-1)`` beside ``delta^l``."""
        return _split_needs(self.grid, self.hop, s, last)

    def fill(self) -> None:
        top = self.grid.top
        for d in range(top):
            for s in range(1, top - d + 1):
                self.fill_pair(s, s + d)

    def fill_pair(self, s: int, last: int) -> None:
        if last > s:
            barrier = np.where(self.memory[None, :] >= self.split_needs(s, last)[:, None], 0.0, np.inf)
            for end in range(s + 1, last + 1):
                stacked = np.array([self.by_end[(split, end, last)] for split in range(s + 1, end + 1)])
                self.right[(s, end, last)] = (stacked + barrier[: end - s]).min(axis=0) - self.prefix[s - 1]
        for t in range(s, last + 1):
            best = self.entry(s, t, last)
            self.cost[(s, t, last)] = best
            self.by_end[(s, t, last)] = self.shift(best, int(self.a[s - 1])) + self.prefix[s - 1]

    def entry(self, s: int, t: int, last: int) -> np.ndarray:
        best = np.full(self.width, np.inf)
        if t < last:
            pieces = np.array([self.right[(s, end, last)] + self.cost[(s, t, end - 1)] for end in range(t + 1, last + 1)])
            best = pieces.min(axis=0)
        if s < t:
            moved = self.uf[s] + self.shift(self.cost[(s + 1, t, last)], int(self.a[s] - self.a[s - 1]))
            moved[self.memory < self.delta[last] + self.a[s] + self.of[s]] = np.inf
            np.minimum(best, moved, out=best)
        if s == t:
            need = max(self.delta[last] + self.abar[s] + self.of[s],
                       self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s])
            rest = 0.0 if last == s else self.shift(self.cost[(s + 1, s + 1, last)], int(self.abar[s]))
            recorded = np.where(self.memory >= need, self.uf[s] + self.ub[s] + rest, np.inf)
            np.minimum(best, recorded, out=best)
        return best


def compute_table(chain: Chain, slots: int = DEFAULT_SLOTS, *, grid: DiscreteChain | None = None) -> OptimalTable:
    """Fills the weak-persistent DP for every memory 0..slots (``grid`` overrides ``slots``).

    Raises:
        TableTooLargeError: the tables would take more than ``MAX_TABLE_BYTES`` (they grow as ``L^3 * slots``).
    """
    grid = grid if grid is not None else discretize(chain, slots)
    check_table_size(chain.length, grid.slots)
    filler = _Filler(grid)
    filler.fill()
    return OptimalTable(grid, filler.cost, filler.right, filler.by_end, store_all_peak_bytes(chain))


def _choose(table: OptimalTable, helper: _Filler, s: int, t: int, last: int, m: int) -> tuple:
    """The first operation's choice at ``(s, t, l, m)``, recomputed from the stored tables."""
    cost, grid = table.cost, table.grid
    options: list[tuple[float, tuple]] = []
    if s == t:
        rest = 0.0 if last == s else float(helper.shift(cost[(s + 1, s + 1, last)], int(grid.abar[s]))[m])
        need = max(grid.delta[last] + grid.abar[s] + grid.forward_overhead[s],
                   grid.abar[s] + grid.delta[s] + grid.delta[s - 1] + grid.backward_overhead[s])
        if m >= need:
            options.append((grid.forward_ms[s] + grid.backward_ms[s] + rest, ("all",)))
    if s < t and m >= grid.delta[last] + grid.a[s] + grid.forward_overhead[s]:
        moved = helper.shift(cost[(s + 1, t, last)], int(grid.a[s] - grid.a[s - 1]))[m]
        options.append((grid.forward_ms[s] + float(moved), ("move",)))
    for end in range(t + 1, last + 1):
        options.append((float(table.right[(s, end, last)][m] + cost[(s, t, end - 1)][m]), ("ck", end)))
    value, choice = min(options, key=lambda o: o[0], default=(np.inf, ()))
    if not np.isfinite(value):
        raise AssertionError(f"rebuild reached an infeasible state C({s}, {t}, {last}, {m})")
    if choice[0] != "ck":
        return choice
    end = choice[1]
    needs = helper.split_needs(s, last)
    splits = [(float(helper.by_end[(split, end, last)][m]), split) for split in range(s + 1, end + 1)
              if m >= needs[split - s - 1]]
    return ("ck", end, min(splits)[1])


def rebuild(table: OptimalTable, budget_bytes: int) -> tuple[Op, ...]:
    """The optimal weak-persistent schedule within ``budget_bytes``, read from the table.

    Raises:
        InfeasibleBudgetError: no schedule fits (the message names the minimum feasible budget).
    """
    grid = table.grid
    if budget_bytes >= table.store_all_bytes:
        return store_all_ops(grid.chain)
    m = min(grid.budget_slots(budget_bytes), grid.slots) - int(grid.a[0])
    if m < 0 or not np.isfinite(table.cost[(1, 1, grid.top)][m]):
        detail = f"{grid.slots} slots of {format_bytes(grid.slot_bytes)}"
        raise infeasible("rotor_optimal", int(budget_bytes), table.min_feasible_bytes(), detail)
    helper = _Filler(grid)
    helper.by_end = table.by_end
    ops: list[Op] = []
    stack: list[Op | tuple[int, int, int, int]] = [(1, 1, grid.top, m)]
    while stack:
        item = stack.pop()
        if isinstance(item, Op):
            ops.append(item)
            continue
        s, t, last, m = item
        choice = _choose(table, helper, s, t, last, m)
        if choice[0] == "all":
            ops.append(Op(OpKind.F_ALL, s))
            stack.append(Op(OpKind.B, s))
            if last > s:
                stack.append((s + 1, s + 1, last, m - int(grid.abar[s])))
        elif choice[0] == "move":
            ops.append(Op(OpKind.F_NONE, s))
            stack.append((s + 1, t, last, min(grid.slots, m + int(grid.a[s - 1] - grid.a[s]))))
        else:
            _, end, split = choice
            ops += [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
            stack += [(s, t, end - 1, m), (split, end, last, m - int(grid.a[split - 1]))]
    return tuple(ops)


def least_memory(grid: DiscreteChain) -> np.ndarray:
    """``need[s, t, l]``: the fewest slots ``m`` for which ``C(s, t, l, m)`` is finite (inf: none up to
    ``grid.slots``).

    The DP's feasibility alone, without the memory axis, following :class:`_Filler` case by case: every
    condition is ``m >= x``, so the memories where ``C(s, t, l, .)`` is finite are ``need .. slots``. A
    shift by a negative amount (``F_none(s)`` when ``a^s < a^{s-1}``) reads the table's top, so an entry
    above ``slots`` is infinite before its parents read it. Each ``(s, l)`` pair is vectorised over the
    ends and splits: ``O(L^2)`` NumPy calls, nothing as wide as the memory axis (``slots`` may be huge).
    Its reference is the table (the tests compare every entry).
    """
    a, abar, delta = grid.a, grid.abar, grid.delta
    of, ob, hop = grid.forward_overhead, grid.backward_overhead, _hops(grid)
    top = grid.top
    need = np.full((top + 2, top + 2, top + 2), np.inf)
    for d in range(top):
        for s in range(1, top - d + 1):
            last = s + d
            ends = np.arange(s + 1, last + 1)  # t' in the F_ck case, also the splits s'
            starts = np.arange(s, last + 1)  # t
            best = np.full(len(starts), np.inf)
            if last > s:
                # G(s, t', l, .): min over s' <= t' of max(split need, a^{s'-1} + need[s', t', l])
                after = a[ends - 1][None, :] + need[ends[None, :], ends[:, None], last]  # [t', s']
                by_split = np.maximum(_split_needs(grid, hop, s, last)[None, :], after)
                by_split[ends[None, :] > ends[:, None]] = np.inf
                right = by_split.min(axis=1)
                pieces = np.maximum(right[None, :], need[s, starts[:, None], ends[None, :] - 1])
                pieces[ends[None, :] <= starts[:, None]] = np.inf
                best = pieces.min(axis=1)
                moved = np.maximum(delta[last] + a[s] + of[s], (a[s] - a[s - 1]) + need[s + 1, starts[1:], last])
                np.minimum(best[1:], moved, out=best[1:])
            recorded = max(delta[last] + abar[s] + of[s], abar[s] + delta[s] + delta[s - 1] + ob[s])
            if last > s:
                recorded = max(recorded, abar[s] + need[s + 1, s + 1, last])
            best[0] = min(best[0], recorded)
            best[best > grid.slots] = np.inf
            need[s, starts, last] = best
    return need


def threshold_bytes(grid: DiscreteChain, store_all_bytes: int) -> int:
    """The smallest budget with a schedule on ``grid``: :meth:`OptimalTable.min_feasible_bytes`, without the table."""
    root = int(grid.a[0]) + least_memory(grid)[1, 1, grid.top]
    return min(grid.to_bytes(int(root)), store_all_bytes) if root <= grid.slots else store_all_bytes


def minimum(chain: Chain, slots: int = DEFAULT_SLOTS) -> Minimum:
    """The minimum feasible budget with each budget on its own grid (see :mod:`budget_grid`).

    Raises:
        TableTooLargeError: :func:`plan` could not solve it (its tables would not fit ``MAX_TABLE_BYTES``).
    """
    check_table_size(chain.length, slots)
    top = store_all_peak_bytes(chain)

    def threshold_on(count: int, reference: int) -> int:
        return threshold_bytes(discretize(chain, count, reference), top)

    found = lowest_budget(partial(threshold_on, slots), top, slots, exact_floor(threshold_on, top))
    assert found is not None, "store-all's peak always has a schedule"
    return found


def min_budget_bytes(chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
    """The smallest budget for which :func:`plan` finds a schedule (each budget on its own grid).

    Raises:
        TableTooLargeError: the tables would not fit ``MAX_TABLE_BYTES``.
    """
    return minimum(chain, slots).budget_bytes


def plan(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
    """The optimal weak-persistent schedule within ``budget_bytes``, on the budget's own grid: ``slots``
    slots spanning the budget, capped at store-all's peak.

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one (named).
        TableTooLargeError: the tables would not fit ``MAX_TABLE_BYTES``.
    """
    def solve_on(reference: int, budget: int) -> Plan:
        table = compute_table(chain, grid=discretize(chain, slots, reference))
        return Plan(rebuild(table, budget), ScheduleParams(slots=slots, slot_bytes=table.grid.slot_bytes))

    return plan_on_own_grid("rotor_optimal", budget_bytes, store_all_peak_bytes(chain), solve_on,
                            partial(minimum, chain, slots), f"{slots} slots spanning each budget")
