"""Griewank's binomial checkpointing: the optimal forward count and split, and the schedule they build.

The model is revolve's (Griewank 1992; Griewank & Walther 2000): ``n`` steps to reverse, ``s`` snapshots
(the start state counts as one) and one working state. A step is reversed by one *taped* forward right
before its backward; every other forward only advances the working state. With
``beta(s, r) = C(s + r, s)``, the steps that ``s`` snapshots reverse with at most ``r`` advances of each step,
and ``r`` the least repetition number with ``beta(s, r) >= n``, the fewest advancing forwards are

    T(n, s) = r * n - beta(s + 1, r - 1)

(``T(1, s) = 0``; ``T(n, 1) = n (n - 1) / 2``; no schedule exists for ``n >= 2`` without a snapshot).

**Convention.** A chain of ``L`` stages plus the loss has ``n = L + 1`` steps, stage ``l`` being step
``l``; ``a^0`` is the first snapshot. :func:`forward_count` counts *every* forward of the schedule,
``F_ck + F_none + F_all``: ``T(n, s)`` advances plus the ``n`` taped ones. That is the count of the
usual tables: 100 steps with 10 snapshots take 322 forwards (222 advances), 1,000 steps 4,636 (3,636).

**Split.** ``T`` is convex in ``n`` with increments ``rep(k, s)`` (the k-th step's repetition number), so
for the first advance of ``m`` steps (snapshot at step ``m``, the right part reversed with ``s - 1``
snapshots, then the left part with ``s``), ``f(m) = m + T(m, s) + T(n - m, s - 1)`` is convex and
every ``m`` with

    max(beta(s, r - 2), n - beta(s - 1, r)) <= m <= min(beta(s, r - 1), n - beta(s - 1, r - 1))

is a minimum: there ``rep(m, s) <= r - 1 <= rep(m + 1, s)`` and ``rep(n - m, s - 1) <= r <= rep(n - m + 1, s - 1)``,
so ``f`` stops falling and starts rising. The range is never empty since ``beta(s, r - 1) < n <= beta(s, r)``
and ``beta(s, r) = beta(s, r - 1) + beta(s - 1, r)``. :func:`split` takes its upper end. The tests check the
counts of the built schedules against the closed form and against a brute force over every split
(``reference/binomial.py``).

The schedule is built by an explicit stack (no recursion limit at 100,000 stages) in ``O(ops)`` time and
``O(L)`` memory besides the ops, which are shared :class:`Op` objects (one per kind and stage).
"""

from __future__ import annotations

from math import comb

from planner.model.schedule import Op, OpKind


def beta(snapshots: int, repetitions: int) -> int:
    """``C(snapshots + repetitions, snapshots)``: steps reversible with ``snapshots`` and ``repetitions``; 0 below 0."""
    if snapshots < 0 or repetitions < 0:
        return 0
    return comb(snapshots + repetitions, snapshots)


def repetitions(steps: int, snapshots: int, upper: int | None = None) -> int:
    """The least ``r`` with ``beta(snapshots, r) >= steps`` (0 for one step).

    Args:
        steps: ``n >= 1``.
        snapshots: ``s >= 1`` (``s = 0`` only reverses a single step).
        upper: a known ``r`` at or above the answer (a parent's), to count down from instead of up.

    Raises:
        ValueError: ``steps >= 2`` without a snapshot, or ``steps < 1``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, found {steps}")
    if steps == 1:
        return 0
    if snapshots < 1:
        raise ValueError(f"{steps} steps need at least 1 snapshot, found {snapshots}")
    if upper is not None:
        reps = upper
        while reps > 1 and beta(snapshots, reps - 1) >= steps:
            reps -= 1
        return reps
    reps, reach = 1, snapshots + 1  # beta(s, 1)
    while reach < steps:
        reps += 1
        reach = reach * (snapshots + reps) // reps  # beta(s, r) from beta(s, r - 1)
    return reps


def advances(steps: int, snapshots: int) -> int:
    """``T(n, s)``: the fewest advancing forwards that reverse ``steps`` with ``snapshots`` (closed form)."""
    reps = repetitions(steps, snapshots)
    return reps * steps - beta(snapshots + 1, reps - 1)


def forward_count(steps: int, snapshots: int) -> int:
    """Every forward of the optimal schedule, taped ones included: ``T(n, s) + n`` (322 for 100 steps, 10 snapshots)."""
    return advances(steps, snapshots) + steps


def split(steps: int, snapshots: int, reps: int) -> int:
    """An optimal first advance ``m`` (1 <= m < steps) for ``steps >= 2`` with ``reps = repetitions(steps, snapshots)``."""
    high = min(beta(snapshots, reps - 1), steps - beta(snapshots - 1, reps - 1))
    return max(1, min(high, steps - 1))


def op_tables(top: int) -> tuple[list[Op], list[Op], list[Op], list[Op]]:
    """Shared ``F_ck``, ``F_none``, ``F_all`` and ``B`` operations for stages ``1..top``, by stage (index 0 unused)."""
    tables = []
    for kind in (OpKind.F_CK, OpKind.F_NONE, OpKind.F_ALL, OpKind.B):
        tables.append([Op(kind, 1)] + [Op(kind, stage) for stage in range(1, top + 1)])
    return tables[0], tables[1], tables[2], tables[3]


def binomial_ops(length: int, snapshots: int) -> tuple[Op, ...]:
    """The binomial schedule of a chain of ``length`` stages plus the loss with ``snapshots`` (a^0 one of them).

    Snapshots beyond ``length`` change nothing (every a^l, l < L + 1, is then kept once).

    Raises:
        ValueError: ``length < 1`` or ``snapshots < 1``.
    """
    if length < 1:
        raise ValueError(f"a chain has at least 1 stage, found {length}")
    if snapshots < 1:
        raise ValueError(f"binomial checkpointing needs at least 1 snapshot (a^0), found {snapshots}")
    top = length + 1
    ck, none, forward, backward = op_tables(top)
    ops: list[Op] = []
    # (first, last, snapshots, repetitions bound): reverse stages first..last from a^{first-1}
    stack: list[tuple[int, int, int, int | None]] = [(1, top, min(snapshots, length), None)]
    while stack:
        first, last, snaps, bound = stack.pop()
        if first == last:
            ops += (forward[first], backward[first])
            continue
        steps = last - first + 1
        reps = repetitions(steps, snaps, bound)
        cut = first + split(steps, snaps, reps)  # advance to a^{cut-1}, keep it
        ops.append(ck[first])
        ops += none[first + 1 : cut]
        stack.append((first, cut - 1, snaps, reps))  # second: the left part, all snapshots free again
        stack.append((cut, last, snaps - 1, reps))  # first: the right part, one snapshot fewer
    return tuple(ops)
