"""The vectorised fill of ROTOR's persistent DP table (see ``rotor.py`` for the recurrence and its use).

Speed (``O(L^3 * slots)`` in the worst case, about a quarter of it in practice): the DP is filled one
diagonal ``d = t - s`` at a time, all ``s`` at once. The ``F_ck`` branch, ``min over s'`` of
``U(s..s'-1) + C(s', t, m - a^{s'-1}) + C(s, s'-1, m)``, adds two contiguous slabs per split: ``cost``
and ``by_end`` are stored by sub-chain length, and ``by_end`` already holds the first term (shifted by
``a^{s'-1}``, offset by the forward-time prefix), so the inner loop needs no gather. Three things skip
work without changing any value:

* each row is only computed inside its memory window: below a lower bound no schedule exists, and from
  the sub-chain's store-all need on the optimum is its store-all time (``_Bounds``);
* a split costs at least its forward recomputation plus both sub-chains at store-all time; the split
  ``s' = s+1`` and ``F_all(s)``, computed first, bound the optimum from above, and every other split is
  only evaluated on the memory columns where its floor is below that bound (``_other_splits``);
* the paper's bound ``m_none`` (every forward between ``s`` and ``t`` must fit beside ``delta^t``) is
  part of the window's lower bound: a split whose own forwards fit but whose later forwards do not is
  infeasible in its sub-problem anyway, which the tests check against the reference that tests each
  split on its own.

Values are float32, to halve the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.solvers.discretize import DiscreteChain
from planner.solvers.option_grid import OptionGrid

_F32 = np.float32
_INF = _F32(np.inf)


@dataclass(frozen=True)
class Arrays:
    """The grid's arrays in the dtypes the DP uses."""

    a: np.ndarray
    abar: np.ndarray
    delta: np.ndarray
    of: np.ndarray
    ob: np.ndarray
    prefix: np.ndarray  # float32, prefix[j] = u_f(1) + .. + u_f(j)
    both: np.ndarray  # float32, u_f(l) + u_b(l)
    hop: np.ndarray  # hop[j] = a^{j-1} + a^j + o_f^j: memory of F_none(j) beside delta

    @classmethod
    def of_grid(cls, grid: DiscreteChain) -> Arrays:
        a = grid.a
        hop = np.zeros_like(a)
        hop[1:] = a[:-1] + a[1:] + grid.forward_overhead[1:]
        prefix = np.concatenate([[0.0], np.cumsum(grid.forward_ms[1:])]).astype(_F32)
        both = (grid.forward_ms + grid.backward_ms).astype(_F32)
        return cls(a, grid.abar, grid.delta, grid.forward_overhead, grid.backward_overhead, prefix, both, hop)

    def need_all(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Memory of ``F_all(s)`` beside ``delta^t`` and of ``B(s)``, ``a^{s-1}`` not counted."""
        forward = self.delta[t] + self.abar[s] + self.of[s]
        backward = self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s]
        return np.maximum(forward, backward)

    def need_option(self, options: OptionGrid, k: int, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        """:meth:`need_all` with ``F_all(s)`` recording option ``k``: the forward holds a-bar_k; ``B(s)``
        first recomputes what it dropped (a-bar^s plus the option's recomputation overhead), then needs the
        full a-bar^s."""
        forward = self.delta[t] + options.abar[k, s] + self.of[s]
        backward = self.abar[s] + self.delta[s] + self.delta[s - 1] + self.ob[s]
        need = np.maximum(forward, backward)
        return need if k == 0 else np.maximum(need, self.abar[s] + self.delta[s] + options.recompute_overhead[k, s])


class _Shifter:
    """Row-wise shifts ``out[i, m] = rows[i, m - by[i]]`` (inf below ``max(by[i], floor[i])``) of the first rows.

    The flat gather indices and the masks of the leading columns are built once for all rows.
    """

    def __init__(self, by: np.ndarray, width: int) -> None:
        columns = np.arange(width)[None, :]
        self.by = by
        self.flat = (np.arange(len(by)) * width)[:, None] + np.clip(columns - by[:, None], 0, width - 1)
        self.before = columns < by[:, None]

    def __call__(self, rows: np.ndarray, floor: np.ndarray | None = None) -> np.ndarray:
        count, width = rows.shape
        out = np.take(np.ascontiguousarray(rows).reshape(-1), self.flat[:count])
        if floor is None:
            np.putmask(out, self.before[:count], _INF)
        else:
            np.putmask(out, np.arange(width)[None, :] < np.maximum(self.by[:count], floor)[:, None], _INF)
        return out


def fill(grid: DiscreteChain, mode: str, options: OptionGrid | None = None) -> np.ndarray:
    """The cost table ``cost[t-s, s-1, m] = C(s, t, m)`` (float32) of ``mode`` ``"rotor"`` or ``"revolve"``.

    With ``options`` (rotor mode), ``F_all(s)`` first takes the best of the stage's recomputation options
    (the selective DP): ``u_f + C(s+1, t, m - abar_k^s) + u_b + r_k``.
    """
    top, width = grid.top, grid.slots + 1
    arr = Arrays.of_grid(grid)
    memory = np.arange(width)[None, :]
    starts = np.arange(1, top + 1)
    by_input = _Shifter(arr.a[starts - 1], width)  # row s: by a^{s-1}
    by_saved = _Shifter(arr.abar[starts], width)  # row s: by a-bar^s
    by_option = [_Shifter(options.abar[k, starts], width) for k in range(options.size)] if options else []
    # Length-major, so that one split of one diagonal is a contiguous slab in both tables. Only entries
    # with t <= L+1 are ever written or read; np.empty spares touching the other half.
    cost = np.empty((top, top, width), dtype=_F32)  # cost[t-s, s-1, m] = C(s, t, m)
    # by_end[t-s', t-1, m] = C(s', t, m - a^{s'-1}) + U(s'-1): the F_ck branch's first term, by end.
    by_end = np.empty((top, top, width), dtype=_F32)
    cost[0] = np.where(memory >= arr.need_all(starts, starts)[:, None], arr.both[starts][:, None], _INF)
    by_end[0] = by_input(cost[0]) + arr.prefix[starts - 1][:, None]
    bounds = _Bounds(arr, top)
    scratch = np.empty(max(top * width, _BLOCK_ELEMENTS) + top * width, dtype=_F32)
    for d in range(1, top):
        count = top - d
        s = starts[:count]
        t = s + d
        low, high = bounds.advance(d, width)
        # Split at s' = s + 1 first: with F_all(s) it bounds the optimum from above, which prunes the
        # other splits. Below `low` the bound may be too low, but no schedule exists there anyway.
        best = by_end[d - 1, d:top] + cost[0, :count]
        if mode == "rotor" and options is not None:
            np.minimum(best, _record_options(arr, options, by_option, cost[d - 1, 1 : count + 1], s, t), out=best)
        elif mode == "rotor":
            record_first = by_saved(cost[d - 1, 1 : count + 1], floor=arr.need_all(s, t))
            record_first += (arr.both[s] + arr.prefix[s - 1])[:, None]  # into the split branch's offset
            np.minimum(best, record_first, out=best)
        else:
            high[:] = width  # revolve has no closed form above the store-all need
        _other_splits(cost, by_end, d, low, high, bounds.floor_ms(s, t, d), best, scratch)
        best -= arr.prefix[s - 1][:, None]
        below = int(low.max())  # masks only touch the columns they can change
        np.putmask(best[:, :below], memory[:, :below] < low[:, None], _INF)
        if mode == "rotor":
            above = int(high.min())
            np.copyto(best[:, above:], bounds.all_ms(s, t)[:, None], where=memory[:, above:] >= high[:, None])
        cost[d, :count] = best
        by_end[d, d:top] = by_input(best) + arr.prefix[s - 1][:, None]
    return cost


def _record_options(
    arr: Arrays, options: OptionGrid, shifters: list[_Shifter], rows: np.ndarray, s: np.ndarray, t: np.ndarray
) -> np.ndarray:
    """``F_all(s)`` first with its best option, offset by ``U(s-1)`` as the split branch (option 0 as rotor's)."""
    best = np.full(rows.shape, _INF, dtype=_F32)
    for k, shift in enumerate(shifters):
        value = shift(rows, floor=arr.need_option(options, k, s, t))
        value += (arr.both[s] + options.recompute_ms[k, s] + arr.prefix[s - 1])[:, None]
        np.minimum(best, value, out=best)
    return best


_MARGIN = 1e-6  # relative: float32 rounding must not let a pruned candidate undercut the bound


def _other_splits(
    cost: np.ndarray, by_end: np.ndarray, d: int, low: np.ndarray, high: np.ndarray, floor: np.ndarray,
    best: np.ndarray, scratch: np.ndarray,
) -> None:
    """Lowers ``best`` (``U(s-1)``-offset, holding an upper bound) by the splits ``s' = s+2 .. t``.

    A split costs at least ``floor[s, k]``: its forward recomputation plus the store-all time of both
    sub-chains. Where that exceeds ``best`` -- an upper bound of the optimum, and non-increasing in ``m``
    -- the split cannot win, so each split is only evaluated on the memory columns below the point where
    it stops mattering for some row, and within the rows' windows ``[low, high)``. Consecutive splits
    are evaluated together (one add and one reduce) while their slabs stay cache-sized.
    """
    count = best.shape[0]
    top = by_end.shape[1]
    lo = int(low.min())
    reach = np.minimum(_reach(best, floor), high[:, None]).max(axis=0)  # reach[k-1]: columns < reach matter
    reduced = scratch[-count * best.shape[1] :].reshape(count, best.shape[1])
    useful = np.flatnonzero(reach[1:] <= lo)
    last = d if useful.size == 0 else int(useful[0]) + 1  # floors grow with k: later splits cannot win
    k = 2
    while k <= last:
        hi = int(reach[k - 1])
        block = max(1, min(last + 1 - k, _BLOCK_ELEMENTS // (count * (hi - lo))))
        # splits k .. k+block-1 read planes by_end[d-k] down to by_end[d-k-block+1] and cost[k-1 ..]
        slab = scratch[: block * count * (hi - lo)].reshape(block, count, hi - lo)
        np.add(by_end[d - k - block + 1 : d - k + 1, d:top, lo:hi][::-1], cost[k - 1 : k - 1 + block, :count, lo:hi],
               out=slab)
        if block > 1:
            np.minimum.reduce(slab, axis=0, out=reduced[:, : hi - lo])
            np.minimum(best[:, lo:hi], reduced[:, : hi - lo], out=best[:, lo:hi])
        else:
            np.minimum(best[:, lo:hi], slab[0], out=best[:, lo:hi])
        k += block


_BLOCK_ELEMENTS = 1 << 18  # candidates per NumPy call when batching splits (measured best on 2 cores)


_REACH_STEP = 4  # _reach samples every 4th column and rounds up: at most 3 needless columns per split


def _reach(bound: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """An upper bound of the number of leading columns where ``bound[i, m] >= floor[i, k]`` (bound non-increasing).

    Columns are sampled every ``_REACH_STEP``: if the sample ``m = j * step`` fails, so do all later
    columns, so ``step`` times the passing samples bounds the exact count from above. One
    ``searchsorted`` over all rows: each row is negated (so non-decreasing) and lifted by its own
    offset, so the rows sit one after another in a single sorted array.
    """
    full_width = bound.shape[1]
    bound = bound[:, ::_REACH_STEP]
    count, width = bound.shape
    finite_top = float(np.max(floor, initial=0.0))
    big = 4.0 * max(finite_top, float(np.max(bound, where=np.isfinite(bound), initial=0.0))) + 1.0
    lift = (np.arange(count, dtype=np.float64) * 4.0 * big)[:, None]
    keys = np.clip(-bound.astype(np.float64), -big, big) + lift
    queries = -floor * (1.0 - _MARGIN) + lift
    found = np.searchsorted(keys.ravel(), queries.ravel(), side="right").reshape(floor.shape)
    return np.minimum((found - (np.arange(count) * width)[:, None]) * _REACH_STEP, full_width)


class _Bounds:
    """Per-diagonal memory bounds of ``C(s, s+d, .)``, updated incrementally as ``d`` grows.

    * below ``low`` no schedule exists: every ``B(j)`` of the sub-chain needs its inputs, output and
      overhead at once, and every forward between ``s`` and ``t`` must fit beside ``delta^t`` (m_none);
    * from ``high`` on (rotor mode) store-all of the sub-chain fits, so the optimum is its time, the sum of
      every ``u_f + u_b``, which no schedule can beat.
    """

    def __init__(self, arr: Arrays, top: int) -> None:
        self.arr = arr
        index = np.arange(1, top + 1)
        cum = np.concatenate([[0], np.cumsum(arr.abar[1:])])  # abar^1 + .. + abar^j
        self.cum = cum
        self.fwd_key = cum[index] + arr.of[index]  # store-all's F_all(j), minus what precedes s
        self.bwd_key = cum[index] + arr.delta[index] + arr.delta[index - 1] + arr.ob[index]
        self.inner_bwd = arr.a[index - 1] + arr.abar[index] + arr.delta[index] + arr.delta[index - 1] + arr.ob[index]
        self.run_fwd = self.fwd_key.copy()  # max over j in [s, t]
        self.run_bwd = self.bwd_key.copy()
        self.run_inner_bwd = np.full(top, np.iinfo(np.int64).min // 4, dtype=np.int64)  # j in (s, t]
        self.run_hop = np.full(top, np.iinfo(np.int64).min // 4, dtype=np.int64)  # j in (s, t)
        self.both64 = np.concatenate([[0.0], np.cumsum(arr.both[1:].astype(np.float64))])
        self.prefix64 = arr.prefix.astype(np.float64)

    def advance(self, d: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Bounds for diagonal ``d``: (low, high), capped to ``width``."""
        arr, count = self.arr, len(self.run_fwd) - d
        s = np.arange(1, count + 1)
        t = s + d
        if d >= 2:
            np.maximum(self.run_hop[:count], arr.hop[t - 1], out=self.run_hop[:count])
        np.maximum(self.run_inner_bwd[:count], self.inner_bwd[t - 1], out=self.run_inner_bwd[:count])
        np.maximum(self.run_fwd[:count], self.fwd_key[t - 1], out=self.run_fwd[:count])
        np.maximum(self.run_bwd[:count], self.bwd_key[t - 1], out=self.run_bwd[:count])
        m_none = arr.delta[t] + np.maximum(arr.a[s] + arr.of[s], self.run_hop[:count])
        own_bwd = arr.abar[s] + arr.delta[s] + arr.delta[s - 1] + arr.ob[s]
        low = np.maximum(np.maximum(m_none, own_bwd), self.run_inner_bwd[:count])
        before = self.cum[s - 1]
        high = np.maximum(arr.delta[t] + self.run_fwd[:count], self.run_bwd[:count]) - before
        return np.minimum(low, width), np.minimum(high, width)

    def floor_ms(self, s: np.ndarray, t: np.ndarray, d: int) -> np.ndarray:
        """``floor[i, k-1]``: least cost of splitting ``s_i..t_i`` at ``s' = s_i + k``, offset by ``U(s-1)``.

        The forward ``U(s..s'-1)`` plus each sub-chain at its store-all time (no schedule does better);
        with the offset ``U(s-1)`` the forward part is ``U(s'-1)``. Float64.
        """
        prefix = self.prefix64
        splits = s[:, None] + np.arange(1, d + 1)[None, :]
        return prefix[splits - 1] + (self.both64[t] - self.both64[s - 1])[:, None]

    def all_ms(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Store-all time of each sub-chain ``s..t``, as float32."""
        return (self.both64[t] - self.both64[s - 1]).astype(_F32)


def least_memory(grid: DiscreteChain, mode: str, options: OptionGrid | None = None) -> np.ndarray:
    """``need[s, t]``: the fewest slots ``m`` for which ``C(s, t, m)`` is finite (inf: none up to ``grid.slots``).

    The DP's feasibility alone, without the memory axis. Every condition of the recurrence is ``m >= x``,
    so the memories where ``C(s, t, .)`` is finite are exactly ``need[s, t] .. slots``, with

    * ``s == t``: the memory of ``F_all(s)`` beside ``delta^t`` and of ``B(s)`` (``need_all``);
    * ``F_all(s)`` first (rotor mode): ``max(need_all(s, t), abar^s + need[s+1, t])``, or with ``options``
      the least of ``max(need_option(k), abar_k^s + need[s+1, t])`` over the options ``k``;
    * ``F_ck(s) F_none(s+1) .. F_none(s'-1)`` first: ``max(delta^t + max(a^s + o_f^s, hop^{s+1..s'-1}),
      a^{s'-1} + need[s', t], need[s, s'-1])``.

    ``O(L^3)`` scalars, vectorised over ``s`` and ``s'`` per diagonal: a few ms at L = 100, against a
    table fill's hundreds. Its reference is the table itself (the tests compare it with the first finite
    column of every row of both the fast and the slow table).
    """
    arr = Arrays.of_grid(grid)
    top = grid.top
    need = np.full((top + 2, top + 1), np.inf)
    starts = np.arange(1, top + 1)
    need[starts, starts] = arr.need_all(starts, starts)
    for d in range(1, top):
        s = starts[: top - d]
        t = s + d
        splits = s[:, None] + np.arange(1, d + 1)[None, :]  # s' = s+1 .. t
        inner = np.full(splits.shape, -np.inf)  # max of hop[s+1 .. s'-1]
        inner[:, 1:] = np.maximum.accumulate(arr.hop[splits[:, :-1]], axis=1)
        forward = arr.delta[t][:, None] + np.maximum((arr.a[s] + arr.of[s])[:, None], inner)
        right = arr.a[splits - 1] + need[splits, t[:, None]]
        left = need[s[:, None], splits - 1]
        best = np.maximum(np.maximum(forward, right), left).min(axis=1)
        if mode == "rotor" and options is not None:
            for k in range(options.size):
                record = np.maximum(arr.need_option(options, k, s, t), options.abar[k, s] + need[s + 1, t])
                np.minimum(best, record, out=best)
        elif mode == "rotor":
            np.minimum(best, np.maximum(arr.need_all(s, t), arr.abar[s] + need[s + 1, t]), out=best)
        need[s, t] = best
    need[need > grid.slots] = np.inf
    return need
