"""Slow, obviously-correct reference for the offload DP: every schedule of its family, replayed by the simulator.

The family (see ``offload_fill.py``): the first forward sweep runs each stage ``s`` as keep (``F_all(s)``),
offload (``F_all(s) OFFLOAD(s)``) or the start of a recomputed block ``s..j`` (``F_ck(s) F_none(s+1..j)``);
the backward undoes them in reverse, a kept or offloaded stage by ``B(s)``, a block by any persistent
sequence of its sub-chain (all of them are enumerated, recursively); ``PREFETCH(p)`` of an offloaded stage
``p`` is issued right before the backward of the item holding ``p+1`` (right after ``B(L+1)`` for ``p = L``).
Each sequence is replayed with :func:`planner.simulation.simulator.predict_with_host`, which also enforces the host
cap, and the fastest one within the budget wins. Exponential: chains of a few stages only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from planner.errors import InvalidScheduleError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.simulation.simulator import predict_with_host

MAX_STAGES = 5


def persistent_sequences(s: int, t: int) -> Iterator[list[Op]]:
    """Every persistent sequence from ``a^{s-1}`` and ``delta^t`` to ``delta^{s-1}`` (ROTOR section 4.4)."""
    if s == t:
        yield [Op(OpKind.F_ALL, s), Op(OpKind.B, s)]
        return
    for rest in persistent_sequences(s + 1, t):
        yield [Op(OpKind.F_ALL, s), *rest, Op(OpKind.B, s)]
    for split in range(s + 1, t + 1):
        head = [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, k) for k in range(s + 1, split)]
        for right in persistent_sequences(split, t):
            for left in persistent_sequences(s, split - 1):
                yield head + right + left


def family(chain: Chain) -> Iterator[list[Op]]:
    """Every schedule of the offload DP's family on ``chain``."""
    top = chain.length + 1

    def items(s: int, pending: int) -> Iterator[list[Op]]:
        fetch = [Op(OpKind.PREFETCH, pending)] if pending > 0 and pending == s - 1 else []
        if s == top:
            yield [Op(OpKind.F_ALL, top), Op(OpKind.B, top), *fetch]
            return
        for rest in items(s + 1, pending):
            yield [Op(OpKind.F_ALL, s), *rest, *fetch, Op(OpKind.B, s)]
        if chain.offload_bytes(s) > 0:
            for rest in items(s + 1, s):
                yield [Op(OpKind.F_ALL, s), Op(OpKind.OFFLOAD, s), *rest, *fetch, Op(OpKind.B, s)]
        for j in range(s, top):
            head = [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, k) for k in range(s + 1, j + 1)]
            blocks = list(persistent_sequences(s, j))
            for rest in items(j + 1, pending):
                for block in blocks:
                    yield head + rest + fetch + block

    yield from items(1, 0)


def best(chain: Chain, budget_bytes: int) -> tuple[float, tuple[Op, ...] | None]:
    """The fastest schedule of the family whose simulated peak fits ``budget_bytes``: ``(makespan, ops)``.

    ``(inf, None)`` when none fits.

    Raises:
        ValueError: the chain has more than ``MAX_STAGES`` stages.
    """
    if chain.length > MAX_STAGES:
        raise ValueError(f"the reference enumerates chains of at most {MAX_STAGES} stages, found {chain.length}")
    found: tuple[float, tuple[Op, ...] | None] = (math.inf, None)
    for ops in family(chain):
        try:
            peak, makespan, _ = predict_with_host(chain, ops)
        except InvalidScheduleError:  # over the host cap
            continue
        if peak <= budget_bytes and makespan < found[0]:
            found = (makespan, tuple(ops))
    return found
