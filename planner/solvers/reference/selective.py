"""Slow, obviously-correct selective persistent DP, used by the tests to check ``selective.py``.

Rotor's recurrence written plainly (:class:`~planner.solvers.reference.rotor.ReferencePersistent`) with the
``F_all(s)`` branch tried once per recomputation option ``k`` of stage ``s`` (option 0 keeps everything):

* ``u_f + C(s+1, t, m - abar_k^s) + u_b + r_k``, when ``F_all(s)`` holding a-bar_k^s fits beside
  ``delta^t``, and ``B(s)`` fits: its recomputation (a-bar^s + the option's recomputation overhead beside
  ``delta^s``, for ``k > 0``)
  and its backward (a-bar^s, ``delta^s``, ``delta^{s-1}``, ``o_b``).

Every condition is checked on its own, memory slot by memory slot. The exhaustive yardstick over every
sequence and every option is :func:`planner.solvers.exact.search` (``persistent=True``), which the tests
hold both DPs against.
"""

from __future__ import annotations

import math
from typing import Any

from planner.model.schedule import Op, OpKind
from planner.solvers.discretize import DiscreteChain, to_slots
from planner.solvers.reference.rotor import ReferencePersistent

INF = math.inf


class ReferenceSelective(ReferencePersistent):
    """The selective DP, table filled for every ``(s, t)`` and every memory ``m`` in 0..slots."""

    def __init__(self, grid: DiscreteChain) -> None:
        # [(abar_k in slots, r_k)] per stage, option 0 first; set before the parent fills the table
        self.choices = [[(0, 0.0)]] + [
            [(to_slots(stage.saved_bytes, grid.slot_bytes), 0.0)]
            + [(to_slots(o.saved_bytes, grid.slot_bytes), o.recompute_ms) for o in stage.options]
            for stage in grid.chain.stages
        ]
        self.regrowth = [[0]] + [  # the recomputation's overhead above a-bar^s, in slots, per option
            [0] + [to_slots(stage.recompute_overhead_with(k), grid.slot_bytes) for k in range(1, len(stage.options) + 1)]
            for stage in grid.chain.stages
        ]
        super().__init__(grid, "rotor")

    def _best(self, s: int, t: int, m: int) -> tuple[float, Any]:
        candidates: list[tuple[float, Any]] = []
        if s == t:
            if self._all_fits(s, t, m):
                candidates.append((self.uf[s] + self.ub[s], ("all", 0)))
        else:
            for k, (kept, recompute) in enumerate(self.choices[s]):
                if self._option_fits(s, t, m, k):
                    rest = self.value(s + 1, t, m - kept)
                    candidates.append((self.uf[s] + rest + self.ub[s] + recompute, ("all", k)))
            for split in range(s + 1, t + 1):
                if self._forward_fits(s, split, t, m):
                    forward = sum(self.uf[s:split])
                    total = forward + self.value(split, t, m - self.a[split - 1]) + self.value(s, split - 1, m)
                    candidates.append((total, ("ck", split)))
        candidates = [c for c in candidates if c[0] < INF]
        return min(candidates, key=lambda c: c[0]) if candidates else (INF, None)

    def _option_fits(self, s: int, t: int, m: int, k: int) -> bool:
        kept = self.choices[s][k][0]
        forward = self.delta[t] + kept + self.of[s]
        backward = self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s]
        recompute = self.abar[s] + self.delta[s] + self.regrowth[s][k] if k else 0
        return m >= forward and m >= backward and m >= recompute

    def _rebuild(self, s: int, t: int, m: int) -> list[Op]:
        _, choice = self._best(s, t, m)
        if choice[0] == "all":
            k = choice[1]
            if s == t:
                return [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
            rest = self._rebuild(s + 1, t, m - self.choices[s][k][0])
            return [Op(OpKind.F_ALL, s, k), *rest, Op(OpKind.B, s)]
        split = choice[1]
        head = [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, j) for j in range(s + 1, split)]
        return head + self._rebuild(split, t, m - self.a[split - 1]) + self._rebuild(s, split - 1, m)
