"""The offload DP's tables: the top level of ROTOR's persistent DP with a third choice per stage.

``D(s, m, p, r)`` is the fastest way to run stages ``s..L+1`` from ``a^{s-1}`` (not counted) and
``delta^{L+1}`` to ``delta^{s-1}`` within ``m`` memory slots, where ``p`` is the last stage below ``s``
that was offloaded (0: none) and ``r`` the host slots still free. Each stage ``s`` of the chain's first
forward sweep is one of

* **keep** ``K``: ``F_all(s)`` ... ``B(s)``: ``u_f + D(s+1, m - abar^s, p, r) + u_b``;
* **offload** ``O``: ``F_all(s) OFFLOAD(s)`` ... ``B(s)``: a-bar^s - a^s goes to the host, ``a^s`` stays:
  ``u_f + wait_out(p, s) + D(s+1, m - a^s, s, r - host^s) + u_b``;
* **recompute** ``R(s..j)``: ``F_ck(s) F_none(s+1..j)`` ... then rotor's optimal persistent schedule of the
  block ``s..j`` within what is left: ``U(s..j) + D(j+1, m - a^j, p, r) + C(s, j, m)``,

and ``D(L+1, ., p, .)`` is the loss ``F_all(L+1) B(L+1)``. With no offload this is exactly ROTOR's
``C(s, L+1, m)`` (Theorem 4.8) along its top level, so every rotor schedule is one of these.

Transfers follow :mod:`planner.simulation.streams`, in a fixed placement that makes their cost local:
``OFFLOAD(p)``'s copy overlaps the forwards up to the next ``OFFLOAD`` (retired there, or at the end of the
chain's forward), which sum to ``U(p+1..q)`` whatever is chosen in between, so the wait is
``max(0, d2h(p) - U(p+1..q))``; its device memory (``x_f = abar^p - a^p``) is counted in every forward of
that stretch. ``PREFETCH(p)`` is issued as the backward of the item just above ``p`` (the item holding
stage ``p+1``; for ``p = L`` right after the loss, which the executor does not run) starts: it overlaps that
item's backward ``W`` (``u_b(p+1)``, or the block's ``C``), costs ``max(0, h2d(p) - W)``, and its device
memory (``x_b``) is counted in that backward. One copy per direction is then in flight at a time, and the
simulator's makespan of a rebuilt schedule is the table's value (on 1-byte slots; the tests check it).
The host holds every offloaded stage at the loss, so the host cap bounds their sum: ``r`` counts it in
host slots, sizes rounded up, the cap down.

Optimality: the fastest schedule of that family -- persistent, offloading only stages recorded in the
first forward sweep, with the placement above -- within the budget on the grid; an exhaustive enumeration
of the family replayed by the simulator (``reference/offload.py``) is its yardstick.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.solvers.discretize import DiscreteChain, to_slots
from planner.solvers.rotor import RotorTable

_INF = np.inf
HOST_SLOTS = 16
"""Host slots spanning the host cap when it binds (below every stage offloaded at once)."""


@dataclass(frozen=True, eq=False)
class Costs:
    """The grid's arrays for the offload DP (index ``l`` is stage ``l``; sizes in slots, times in ms).

    Attributes:
        off: a-bar - a of each stage, in device slots (0 at the input and the loss).
        host: the same in host slots (0 when the host cap does not bind).
        host_slots: host slots available (0 when the cap does not bind).
        d2h_ms, h2d_ms: copy times of each stage's a-bar - a.
        prefix_ms: ``prefix_ms[k] = u_f(1) + .. + u_f(k)``.
        offloadable: stages whose ``O`` option exists (1..L, something to move, finite copies, host room).
    """

    grid: DiscreteChain
    off: np.ndarray
    host: np.ndarray
    host_slots: int
    d2h_ms: np.ndarray
    h2d_ms: np.ndarray
    prefix_ms: np.ndarray
    offloadable: np.ndarray

    @classmethod
    def of_grid(cls, grid: DiscreteChain, host_slots: int = HOST_SLOTS) -> Costs:
        chain = grid.chain
        top = grid.top
        transfer = chain.transfer_costs
        off_bytes = [0] + [chain.offload_bytes(s) for s in range(1, top)] + [0]
        total = sum(off_bytes)
        cap = transfer.host_cap_bytes
        if cap is None or cap >= total:
            host, free = np.zeros(top + 1, dtype=np.int64), 0
        else:
            slot = max(1, -(-cap // host_slots))
            host, free = np.array([to_slots(b, slot) for b in off_bytes], dtype=np.int64), cap // slot
        d2h = np.array([transfer.d2h_ms(b) for b in off_bytes])
        h2d = np.array([transfer.h2d_ms(b) for b in off_bytes])
        offloadable = np.array([0 < s < top and off_bytes[s] > 0 and np.isfinite(d2h[s]) and np.isfinite(h2d[s])
                                and host[s] <= free and transfer.host_fits(off_bytes[s]) for s in range(top + 1)])
        prefix = np.concatenate([[0.0], np.cumsum(grid.forward_ms[1:])])
        off = np.array([to_slots(b, grid.slot_bytes) for b in off_bytes], dtype=np.int64)
        return cls(grid, off, host, int(free), d2h, h2d, prefix, offloadable)

    def wait_out(self, p: int, between_ms: float) -> float:
        """The compute stream's wait when ``OFFLOAD(p)``'s copy is retired ``between_ms`` after it started."""
        return max(0.0, float(self.d2h_ms[p]) - between_ms) if p > 0 else 0.0


@dataclass(frozen=True, eq=False)
class OffloadTable:
    """``value[s][p, r, m] = D(s, m, p, r)`` and the choice that reaches it, for ``s`` in 1..L+1, ``p < s``.

    ``choice`` is 0 for keep, 1 for offload, ``2 + (j - s)`` for the block ``s..j``, -1 where infeasible.
    """

    costs: Costs
    rotor: RotorTable
    value: list[np.ndarray]
    choice: list[np.ndarray]

    @property
    def table_bytes(self) -> int:
        """Memory held by the value and choice tables."""
        return sum(int(v.nbytes) for v in self.value[1:]) + sum(int(c.nbytes) for c in self.choice[1:])


def table_bytes_for(grid: DiscreteChain, host_slots: int) -> int:
    """The bytes :func:`fill` would hold on ``grid`` (to refuse a table that would not fit)."""
    pairs = (grid.top + 1) * grid.top // 2
    return pairs * (host_slots + 1) * (grid.slots + 1) * (8 + 2)


def _shift(rows: np.ndarray, by: int) -> np.ndarray:
    """``out[..., m] = rows[..., m - by]``, inf where ``m < by``."""
    out = np.full_like(rows, _INF)
    if by < rows.shape[-1]:
        out[..., by:] = rows[..., : rows.shape[-1] - by] if by > 0 else rows
    return out


def _shift_host(rows: np.ndarray, by: int) -> np.ndarray:
    """``out[r, m] = rows[r - by, m]``, inf where ``r < by``."""
    if by == 0:
        return rows
    out = np.full_like(rows, _INF)
    if by < rows.shape[0]:
        out[by:] = rows[: rows.shape[0] - by]
    return out


def _take(best: np.ndarray, choice: np.ndarray, candidate: np.ndarray, code: int) -> None:
    better = candidate < best
    best[better] = candidate[better]
    choice[better] = code


def fill(costs: Costs, rotor: RotorTable) -> OffloadTable:
    """Fills ``D`` for every stage, pending offload, host room and memory of the grid (see the module)."""
    grid = costs.grid
    top, width, host = grid.top, grid.slots + 1, costs.host_slots + 1
    length = top - 1
    a, abar, delta, of, ob = grid.a, grid.abar, grid.delta, grid.forward_overhead, grid.backward_overhead
    uf, ub, prefix = grid.forward_ms, grid.backward_ms, costs.prefix_ms
    memory = np.arange(width)
    value: list[np.ndarray] = [np.empty(0)] * (top + 1)
    choice: list[np.ndarray] = [np.empty(0)] * (top + 1)
    need_loss = max(delta[top] + abar[top] + of[top], abar[top] + delta[top] + delta[length] + ob[top])
    loss = np.full((top, host, width), _INF)
    for p in range(top):
        back = float(costs.h2d_ms[length]) if p == length else 0.0
        loss[p][:, memory >= need_loss] = uf[top] + ub[top] + costs.wait_out(p, prefix[length] - prefix[p]) + back
    value[top], choice[top] = loss, np.where(np.isfinite(loss), 0, -1).astype(np.int16)
    for s in range(length, 0, -1):
        best = np.full((s, host, width), _INF)
        chosen = np.full((s, host, width), -1, dtype=np.int16)
        need_forward, need_backward = delta[top] + abar[s] + of[s], abar[s] + delta[s] + delta[s - 1] + ob[s]
        for p in range(s):
            adjacent = p > 0 and p == s - 1
            x_f = int(costs.off[p]) if p > 0 else 0
            x_b = x_f if adjacent else 0
            h_b = float(costs.h2d_ms[p]) if adjacent else 0.0
            recorded = memory >= max(need_forward + x_f, need_backward + x_b)
            step = uf[s] + ub[s] + max(0.0, h_b - ub[s])
            keep = _shift(value[s + 1][p], int(abar[s])) + step
            keep[:, ~recorded] = _INF
            _take(best[p], chosen[p], keep, 0)
            if costs.offloadable[s]:
                tail = _shift_host(_shift(value[s + 1][s], int(a[s])), int(costs.host[s]))
                offload = tail + step + costs.wait_out(p, prefix[s] - prefix[p])
                offload[:, ~recorded] = _INF
                _take(best[p], chosen[p], offload, 1)
            _blocks(value, rotor, grid, s, p, x_f, x_b, h_b, best[p], chosen[p])
        value[s], choice[s] = best, chosen
    return OffloadTable(costs, rotor, value, choice)


def _blocks(value: list[np.ndarray], rotor: RotorTable, grid: DiscreteChain, s: int, p: int, x_f: int, x_b: int,
            h_b: float, best: np.ndarray, chosen: np.ndarray) -> None:
    """Lowers ``best`` (``D(s, ., p, .)``) by the blocks ``s..j``, every ``j`` in one vectorised step.

    Candidate ``j``: ``U(s..j) + D(j+1, m - a^j, p, r) + W + max(0, h_b - W)`` with ``W = C(s, j, m - x_b)``,
    where every forward of the block fits beside ``delta^{L+1}`` and the pending ``x_f``; the first ``j`` of
    the least value wins a tie, after keep and offload.
    """
    top, width = grid.top, grid.slots + 1
    a, delta, of = grid.a, grid.delta, grid.forward_overhead
    ends = np.arange(s, top)  # j = s .. L
    memory = np.arange(width)
    tails = np.stack([value[j + 1][p] for j in ends])  # (J, host, width): D(j+1, ., p, .)
    source = memory[None, :] - a[ends][:, None]  # D(j+1, m - a^j): inf where m < a^j
    tails = np.take_along_axis(tails, np.maximum(source, 0)[:, None, :], axis=2)
    hop = np.zeros(len(ends), dtype=np.int64)  # the forward of F_ck(s) .. F_none(j) beside delta^{L+1} and x_f
    hop[0] = a[s] + of[s]
    if len(ends) > 1:
        hop[1:] = a[ends[1:] - 1] + a[ends[1:]] + of[ends[1:]]
    fits = (source >= 0) & (memory[None, :] >= (delta[top] + x_f + np.maximum.accumulate(hop))[:, None])
    inner = rotor.cost[: len(ends), s - 1].astype(np.float64)  # C(s, j, m) for j = s .. L
    inner = _shift(inner, x_b)
    inner = inner + np.maximum(0.0, h_b - inner) + (grid.forward_ms[s : top].cumsum())[:, None]
    candidates = np.where(fits[:, None, :], tails + inner[:, None, :], _INF)
    pick = np.argmin(candidates, axis=0)
    lowest = np.take_along_axis(candidates, pick[None], axis=0)[0]
    better = lowest < best
    best[better] = lowest[better]
    chosen[better] = (2 + pick[better]).astype(chosen.dtype)


def least_memory(costs: Costs, rotor_need: np.ndarray) -> float:
    """The fewest slots (``a^0`` included) with a schedule of the family, the host cap left out: a floor.

    The same recurrence as :func:`fill` on feasibility alone (every condition is ``m >= x``), ``O(L^3)``
    scalars; ``rotor_need[s, t]`` is :func:`planner.solvers.rotor_fill.least_memory`.
    """
    grid = costs.grid
    top = grid.top
    length = top - 1
    a, abar, delta, of, ob = grid.a, grid.abar, grid.delta, grid.forward_overhead, grid.backward_overhead
    hop = np.zeros(top + 1, dtype=np.int64)
    hop[1:] = a[:-1] + a[1:] + of[1:]
    need: dict[tuple[int, int], float] = {}
    loss = float(max(delta[top] + abar[top] + of[top], abar[top] + delta[top] + delta[length] + ob[top]))
    for p in range(top):
        need[top, p] = loss
    for s in range(length, 0, -1):
        for p in range(s):
            x_f = int(costs.off[p]) if p > 0 else 0
            x_b = x_f if p > 0 and p == s - 1 else 0
            recorded = max(delta[top] + abar[s] + of[s] + x_f, abar[s] + delta[s] + delta[s - 1] + ob[s] + x_b)
            best = max(recorded, abar[s] + need[s + 1, p])
            if costs.offloadable[s]:
                best = min(best, max(recorded, a[s] + need[s + 1, s]))
            forward_need = delta[top] + x_f + a[s] + of[s]
            for j in range(s, top):
                if j > s:
                    forward_need = max(forward_need, delta[top] + x_f + hop[j])
                best = min(best, max(forward_need, a[j] + need[j + 1, p], rotor_need[s, j] + x_b))
            need[s, p] = float(best)
    return float(a[0]) + need[1, 0]
