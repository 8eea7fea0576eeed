"""Binomial checkpointing (Griewank's revolve) for very long chains: no table, ``O(L log L)`` to choose.

The ROTOR DP's table grows as ``L^2 * slots``; this solver keeps none. It places snapshots by
Griewank's binomial split (``binomial_split.py``), which for ``s`` snapshots takes the fewest forwards
when every stage costs the same, and sizes ``s`` from the chain's real sizes:

* **Snapshot count from the budget.** At any moment a binomial schedule with ``s`` snapshots holds
  ``a^0``, at most ``s - 1`` other kept activations ``a^k`` (``1 <= k <= L``, distinct), and the working
  set of the operation running: an advance ``F_none(j)`` (``a^{j-1} + a^j + o_f^j`` beside some
  ``delta^t``, ``t > j``) or a taped step ``F_all(j) B(j)`` with its input (``a^{j-1} + a-bar^j + delta^j +
  delta^{j-1} + o_b^j``), plus the parameter gradients computed so far. :func:`memory_bounds` adds
  ``a^0``, the ``s - 1`` largest ``a^k`` and the largest working set: a bound that holds wherever the
  snapshots fall. It is exact for uniform chains and conservative otherwise (the simulated peak of the
  random chains of ``benchmarks/bench_binomial.py`` is reported beside it). :func:`plan` takes the most
  snapshots whose bound fits the budget, so the forward count never rises as the budget grows; with
  unequal stage times the makespan follows the forward count but is not guaranteed monotone.
* **Store-all** at or above its own peak: the binomial schedule tapes every step apart from its advance
  (at least ``2L + 1`` forwards), store-all records each stage once.
* **Length cap.** ``s`` snapshots cost ``T(n, s) + 2n`` operations, ``n^2 / 2`` for ``s = 1``; counts
  whose schedule would exceed :data:`MAX_OPS` operations are not offered, so on a very long chain the
  minimum feasible budget is the bound of the fewest snapshots under the cap (the error says so).

The seed's divide-and-conquer (Ahmed 2021, section 2.2: split the run at half its evaluation steps,
recurse on the second half then the first) is the balanced special case: its depth
``d = ceil(log2 n)`` costs up to ``d`` snapshots and up to ``d`` advances of each step, where the
binomial split with the same ``d`` snapshots advances each step at most ``repetitions(n, d)`` times
(6 against 17 at ``n = 100,001``). It is kept as :func:`bisection_ops` (base case one stage), the
reference the tests and the benchmark compare against, not offered by :func:`plan`, which it never
beats on a uniform chain.

Forward counts (``params.forwards``) follow ``binomial_split``'s convention: every forward of the
schedule, the taped ones included.
"""

from __future__ import annotations

import numpy as np

from planner.model.chain import Chain
from planner.model.schedule import Op
from planner.model.schedule_params import ScheduleParams
from planner.solvers.binomial_split import binomial_ops, forward_count, op_tables
from planner.solvers.common import Plan, infeasible
from planner.solvers.store_all import store_all_ops, store_all_peak_bytes

MAX_OPS = 1 << 22
"""The longest schedule offered (4,194,304 operations: a few seconds to simulate)."""


def operation_count(length: int, snapshots: int) -> int:
    """Operations of :func:`binomial_ops`: every forward (``forward_count``) and one backward per step."""
    steps = length + 1
    return forward_count(steps, min(snapshots, length)) + steps


def fewest_snapshots(length: int, max_ops: int | None = None) -> int | None:
    """The fewest snapshots whose schedule has at most ``max_ops`` operations (``None``: none has)."""
    cap = MAX_OPS if max_ops is None else max_ops
    if operation_count(length, length) > cap:
        return None
    low, high = 1, length  # operation_count falls as snapshots rise: bisect for the first under the cap
    while low < high:
        middle = (low + high) // 2
        if operation_count(length, middle) <= cap:
            high = middle
        else:
            low = middle + 1
    return low


def memory_bounds(chain: Chain) -> np.ndarray:
    """``bound[s]`` (s in 1..L, int64; index 0 unused): a peak no binomial schedule with ``s`` snapshots exceeds.

    ``a^0`` plus the ``s - 1`` largest ``a^k`` (``1 <= k <= L``) plus the largest working set over the
    stages (see the module docstring); non-decreasing in ``s``.
    """
    length = chain.length
    top = length + 1
    a = np.array([chain.a(i) for i in range(top + 1)], dtype=np.int64)
    stages = chain.stages
    abar = np.array([0] + [s.saved_bytes for s in stages], dtype=np.int64)
    delta = np.array([chain.delta(i) for i in range(top + 1)], dtype=np.int64)
    weight = np.array([0] + [s.weight_grad_bytes for s in stages], dtype=np.int64)
    forward_over = np.array([0] + [s.forward_overhead_bytes for s in stages], dtype=np.int64)
    backward_over = np.array([0] + [s.backward_overhead_bytes for s in stages], dtype=np.int64)
    after = np.zeros(top + 2, dtype=np.int64)  # after[l]: parameter gradients of stages l+1..L+1
    after[: top + 1] = np.cumsum(weight[::-1])[::-1] - weight
    held_delta = delta + after[: top + 1]  # delta^l and the parameter gradients held beside it
    j = np.arange(1, top + 1)
    taped = a[j - 1] + abar[j] + held_delta[j] + np.maximum(
        forward_over[j], delta[j - 1] + weight[j] + backward_over[j])
    working = int(taped.max())
    if length >= 1:
        # F_none(j) / F_ck(j), j in 1..L, beside delta^t of some t > j: the largest from j+1 on
        later_delta = np.maximum.accumulate(held_delta[::-1])[::-1]  # later_delta[t] = max over t' >= t
        hops = a[j[:-1] - 1] + a[j[:-1]] + forward_over[j[:-1]] + later_delta[j[:-1] + 1]
        working = max(working, int(hops.max()))
    largest = np.sort(a[1 : length + 1])[::-1]
    kept = np.concatenate([[0], np.cumsum(largest)])  # kept[s-1]: the s-1 largest
    bounds = np.zeros(length + 1, dtype=np.int64)
    bounds[1:] = a[0] + kept[:length] + working
    return bounds


def min_budget_bytes(chain: Chain, slots: int = 0) -> int:
    """The smallest budget :func:`plan` solves: store-all's peak or the fewest allowed snapshots' bound (``slots`` unused)."""
    lowest = fewest_snapshots(chain.length)
    top = store_all_peak_bytes(chain)
    return top if lowest is None else min(top, int(memory_bounds(chain)[lowest]))


def plan(chain: Chain, budget_bytes: int, slots: int = 0) -> Plan:
    """Store-all when it fits, else the binomial schedule with the most snapshots whose bound fits.

    Args:
        chain: the chain.
        budget_bytes: the chain's memory budget.
        slots: unused (no discretisation).

    Raises:
        InfeasibleBudgetError: the budget is below :func:`min_budget_bytes` (named).
    """
    top = store_all_peak_bytes(chain)
    if budget_bytes >= top:
        return Plan(store_all_ops(chain), ScheduleParams(store_all=True))
    length = chain.length
    lowest = fewest_snapshots(length)
    bounds = memory_bounds(chain)
    fits = int(np.searchsorted(bounds[1:], budget_bytes, side="right"))  # snapshots 1..fits fit
    if lowest is None or fits < lowest:
        minimum = top if lowest is None else min(top, int(bounds[lowest]))
        detail = "" if lowest is None or lowest == 1 else (
            f"fewer than {lowest} snapshots would take more than {MAX_OPS} operations")
        raise infeasible("binomial", int(budget_bytes), minimum, detail)
    ops = binomial_ops(length, fits)
    return Plan(ops, ScheduleParams(snapshots=fits, forwards=forward_count(length + 1, fits),
                                    bound_bytes=int(bounds[fits]), store_all=False))


def snapshot_sweep(length: int, count: int) -> list[int]:
    """Up to ``count`` distinct snapshot counts, evenly spaced from the fewest allowed to ``length`` (the Pareto view's points)."""
    lowest = fewest_snapshots(length)
    if lowest is None or count < 1:
        return []
    return sorted({int(s) for s in np.linspace(lowest, max(lowest, length), count).round()})


def bisection_ops(length: int) -> tuple[Op, ...]:
    """The seed's divide-and-conquer: each range split at its middle step, the second half reversed first.

    ``checkpoint-*j`` on stages ``first..last``: one stage is taped and reversed (the base case); otherwise
    advance to the middle (``F_ck F_none ..``, keeping the range's input), reverse the second half from the
    middle's output, then the first half from the input. Depth ``ceil(log2 n)``: as many snapshots and
    advances of each step. A reference for the binomial split (the tests and the benchmark compare them).
    """
    top = length + 1
    ck, none, forward, backward = op_tables(top)
    ops: list[Op] = []
    stack = [(1, top)]
    while stack:
        first, last = stack.pop()
        if first == last:
            ops += (forward[first], backward[first])
            continue
        cut = (first + last + 1) // 2  # the second half starts here: a^{cut-1} is kept
        ops.append(ck[first])
        ops += none[first + 1 : cut]
        stack += [(first, cut - 1), (cut, last)]
    return tuple(ops)

