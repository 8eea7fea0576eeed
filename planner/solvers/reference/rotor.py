"""Slow, obviously-correct persistent DP (ROTOR paper, Theorem 4.8), used by the tests to check rotor.py.

A direct transcription of the recurrence in pure Python, memory slot by memory slot, with the memory of
every operation checked on its own (no shortcut such as the paper's m_none bound). ``C(s, t, m)`` is the
fastest persistent way to go from ``a^{s-1}`` and ``delta^t`` to ``delta^{s-1}`` within ``m`` slots, not
counting ``a^{s-1}``:

* ``s == t``: ``F_all(s) B(s)``.
* ``F_all(s)`` first (rotor mode, or ``s == t``): ``u_f + C(s+1, t, m - abar^s) + u_b``.
* ``F_ck(s) F_none(s+1) .. F_none(s'-1)`` first, for ``s < s' <= t``:
  ``sum(u_f[s..s'-1]) + C(s', t, m - a^{s'-1}) + C(s, s'-1, m)``.

In revolve mode ``F_all(s)`` is only allowed right before ``B(s)`` (the AD model of Griewank & Walther).
"""

from __future__ import annotations

import math
from typing import Any

from planner.model.schedule import Op, OpKind
from planner.solvers.discretize import DiscreteChain

INF = math.inf


class ReferencePersistent:
    """The persistent DP, table filled for every ``(s, t)`` and every memory ``m`` in 0..slots."""

    def __init__(self, grid: DiscreteChain, mode: str = "rotor") -> None:
        if mode not in ("rotor", "revolve"):
            raise ValueError(f"mode must be 'rotor' or 'revolve', found {mode!r}")
        self.grid, self.mode = grid, mode
        self.a, self.abar, self.delta = (list(map(int, v)) for v in (grid.a, grid.abar, grid.delta))
        self.of, self.ob = list(map(int, grid.forward_overhead)), list(map(int, grid.backward_overhead))
        self.uf, self.ub = list(map(float, grid.forward_ms)), list(map(float, grid.backward_ms))
        self.cost: dict[tuple[int, int], list[float]] = {}
        top = grid.top
        for d in range(top):
            for s in range(1, top - d + 1):
                self.cost[(s, s + d)] = [self._best(s, s + d, m)[0] for m in range(grid.slots + 1)]

    def value(self, s: int, t: int, m: int) -> float:
        """``C(s, t, m)``; infinite below 0 slots."""
        return INF if m < 0 else self.cost[(s, t)][min(m, self.grid.slots)]

    def _best(self, s: int, t: int, m: int) -> tuple[float, Any]:
        if s == t:
            return (self.uf[s] + self.ub[s], ("all",)) if self._all_fits(s, t, m) else (INF, None)
        options: list[tuple[float, Any]] = []
        if self.mode == "rotor" and self._all_fits(s, t, m):
            options.append((self.uf[s] + self.value(s + 1, t, m - self.abar[s]) + self.ub[s], ("all",)))
        for split in range(s + 1, t + 1):
            if self._forward_fits(s, split, t, m):
                forward = sum(self.uf[s:split])
                total = forward + self.value(split, t, m - self.a[split - 1]) + self.value(s, split - 1, m)
                options.append((total, ("ck", split)))
        options = [o for o in options if o[0] < INF]
        return min(options, key=lambda o: o[0]) if options else (INF, None)

    def _all_fits(self, s: int, t: int, m: int) -> bool:
        forward = self.delta[t] + self.abar[s] + self.of[s]
        backward = self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s]
        return m >= forward and m >= backward

    def _forward_fits(self, s: int, split: int, t: int, m: int) -> bool:
        """``F_ck(s) F_none(s+1) .. F_none(split-1)`` with ``delta^t`` held (``a^{s-1}`` not counted)."""
        if self.delta[t] + self.a[s] + self.of[s] > m:
            return False
        return all(self.delta[t] + self.a[j - 1] + self.a[j] + self.of[j] <= m for j in range(s + 1, split))

    def ops(self, budget_slots: int) -> tuple[Op, ...] | None:
        """The optimal sequence within ``budget_slots`` (``a^0`` included), or ``None`` when infeasible."""
        m = min(budget_slots, self.grid.slots) - self.a[0]
        if self.value(1, self.grid.top, m) == INF:
            return None
        return tuple(self._rebuild(1, self.grid.top, m))

    def _rebuild(self, s: int, t: int, m: int) -> list[Op]:
        _, option = self._best(s, t, m)
        if s == t:
            return [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
        if option[0] == "all":
            return [Op(OpKind.F_ALL, s), *self._rebuild(s + 1, t, m - self.abar[s]), Op(OpKind.B, s)]
        split = option[1]
        head = [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
        return head + self._rebuild(split, t, m - self.a[split - 1]) + self._rebuild(s, split - 1, m)
