"""Slow, obviously-correct weak-persistent DP (ROTOR paper, Theorem 4.7), used by the tests to check rotor_optimal.py.

``C(s, t, l, m)`` (``l`` is the paper's ell, ``last`` in the code): with ``a^{s-1}`` (the *floating* checkpoint, not counted in ``m``) and ``delta^l`` held,
run ``B(l) .. B(t)`` and end holding only ``delta^{t-1}`` -- the floating checkpoint has moved right to
``a^{t-1}`` and been consumed by ``B(t)`` -- never using more than ``m`` slots. The first operation is one of:

* ``F_all(s)`` when ``s == t``: ``u_f + C(s+1, s+1, l, m - abar^s) + u_b`` (``F_all(s) B(s)`` if ``l == s``);
* ``F_none(s)`` when ``s < t`` (the floating checkpoint moves from ``a^{s-1}`` to ``a^s``):
  ``u_f + C(s+1, t, l, m + a^{s-1} - a^s)``;
* ``F_ck(s) F_none(s+1) .. F_none(s'-1)`` when ``t < l``, for ``s < s' <= t'``, ``t < t' <= l``: run the
  right part from ``a^{s'-1}`` down to ``B(t')``, then the rest from ``a^{s-1}``:
  ``U(s..s'-1) + C(s', t', l, m - a^{s'-1}) + C(s, t, t'-1, m)``.

The paper's ``C_ck(s, t, r, s', t', l)`` is ``r - s`` moves followed by the third case; writing the move as
its own step also covers ``C(s, t, t)`` with ``s < t`` (move the checkpoint to ``a^{t-1}``, then
``F_all(t) B(t)``), which the paper's recurrence leaves infinite, and drops its pruning of moves to a
smaller activation. Memory is checked for every operation exactly; a sub-budget above the table
(possible only after a move to a smaller activation) is read at the table's top, which can only
overestimate a cost.
"""

from __future__ import annotations

import math
from typing import Any

from planner.model.schedule import Op, OpKind
from planner.solvers.discretize import DiscreteChain

INF = math.inf


class ReferenceWeak:
    """The weak-persistent DP, filled for every ``(s, t, l)`` and every memory ``m`` in 0..slots."""

    def __init__(self, grid: DiscreteChain) -> None:
        self.grid = grid
        self.a, self.abar, self.delta = (list(map(int, v)) for v in (grid.a, grid.abar, grid.delta))
        self.of, self.ob = list(map(int, grid.forward_overhead)), list(map(int, grid.backward_overhead))
        self.uf, self.ub = list(map(float, grid.forward_ms)), list(map(float, grid.backward_ms))
        self.cost: dict[tuple[int, int, int], list[float]] = {}
        top = grid.top
        for d in range(top):
            for s in range(1, top - d + 1):
                for t in range(s, s + d + 1):
                    self.cost[(s, t, s + d)] = [self._best(s, t, s + d, m)[0] for m in range(grid.slots + 1)]

    def value(self, s: int, t: int, last: int, m: int) -> float:
        """``C(s, t, l, m)``; infinite below 0 slots, read at the top above the table."""
        return INF if m < 0 else self.cost[(s, t, last)][min(m, self.grid.slots)]

    def _best(self, s: int, t: int, last: int, m: int) -> tuple[float, Any]:
        options = [o for o in self._options(s, t, last, m) if o[0] < INF]
        return min(options, key=lambda o: o[0]) if options else (INF, None)

    def _options(self, s: int, t: int, last: int, m: int) -> list[tuple[float, Any]]:
        a, delta = self.a, self.delta
        options: list[tuple[float, Any]] = []
        if s == t and self._record_fits(s, last, m):
            rest = 0.0 if last == s else self.value(s + 1, s + 1, last, m - self.abar[s])
            options.append((self.uf[s] + rest + self.ub[s], ("all",)))
        if s < t and delta[last] + a[s] + self.of[s] <= m:
            options.append((self.uf[s] + self.value(s + 1, t, last, m + a[s - 1] - a[s]), ("move",)))
        if t < last:
            for split in range(s + 1, last + 1):
                if not self._forward_fits(s, split, last, m):
                    continue
                forward = sum(self.uf[s:split])
                for end in range(max(split, t + 1), last + 1):
                    right = self.value(split, end, last, m - a[split - 1])
                    options.append((forward + right + self.value(s, t, end - 1, m), ("ck", split, end)))
        return options

    def _record_fits(self, s: int, last: int, m: int) -> bool:
        """``F_all(s)`` beside ``delta^l``, and ``B(s)``, within ``m`` (``a^{s-1}`` not counted)."""
        forward = self.delta[last] + self.abar[s] + self.of[s]
        backward = self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s]
        return m >= forward and m >= backward

    def _forward_fits(self, s: int, split: int, last: int, m: int) -> bool:
        """``F_ck(s) F_none(s+1) .. F_none(split-1)`` beside ``delta^l`` within ``m``."""
        if self.delta[last] + self.a[s] + self.of[s] > m:
            return False
        return all(self.delta[last] + self.a[j - 1] + self.a[j] + self.of[j] <= m for j in range(s + 1, split))

    def ops(self, budget_slots: int) -> tuple[Op, ...] | None:
        """The optimal sequence within ``budget_slots`` (``a^0`` included), or ``None`` when infeasible."""
        top = self.grid.top
        m = min(budget_slots, self.grid.slots) - self.a[0]
        if self.value(1, 1, top, m) == INF:
            return None
        return tuple(self._rebuild(1, 1, top, m))

    def _rebuild(self, s: int, t: int, last: int, m: int) -> list[Op]:
        _, option = self._best(s, t, last, m)
        if option[0] == "all":
            middle = [] if last == s else self._rebuild(s + 1, s + 1, last, m - self.abar[s])
            return [Op(OpKind.F_ALL, s), *middle, Op(OpKind.B, s)]
        if option[0] == "move":
            return [Op(OpKind.F_NONE, s), *self._rebuild(s + 1, t, last, m + self.a[s - 1] - self.a[s])]
        _, split, end = option
        head = [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
        return head + self._rebuild(split, end, last, m - self.a[split - 1]) + self._rebuild(s, t, end - 1, m)
