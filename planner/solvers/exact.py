"""Exact optimum by exhaustive search, for small chains: the yardstick the tests hold the DPs against.

A shortest-path search (Dijkstra, on time) over memory states: a state is what is held (see
:class:`~planner.simulation.simulator.MemoryState`), a move is any of ``F_all(l)``, ``F_ck(l)``, ``F_none(l)`` for
every stage and the one ``B`` whose gradient is held, applied with the simulator's own :func:`step`, and
kept only if the memory during it fits the budget; ``F_all(l)`` is tried with each of the stage's
recomputation options (:mod:`planner.model.stage_option`), and ``B(l)`` after an option costs its recomputation
too. Sizes are exact bytes (no slots). Every valid
sequence is a path, so the first state holding ``delta^0`` that leaves the queue ends an optimal one.

With ``persistent=True`` only memory-persistent sequences (ROTOR paper, Definition 4.1) are searched:
after ``F_ck(i)`` or ``F_all(i)`` and until ``B(i)``, no ``F_none(i)`` and no operation on a stage below
``i``. The state then also carries the stages so opened.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from planner.errors import SearchTooLargeError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import MemoryState, StepError, initial_state, step
from planner.solvers.common import Plan, infeasible

MAX_STAGES = 8
MAX_STATES = 2_000_000

_Key = tuple[MemoryState, frozenset[int]]


@dataclass(frozen=True)
class ExactResult:
    """An optimal sequence and its cost."""

    ops: tuple[Op, ...]
    makespan_ms: float
    peak_bytes: int


def _check_size(chain: Chain) -> None:
    if chain.length > MAX_STAGES:
        raise SearchTooLargeError(
            f"exhaustive search handles chains of at most {MAX_STAGES} stages (plus the loss); "
            f"this one has {chain.length}; use rotor or rotor_optimal"
        )


def _moves(chain: Chain, key: _Key, persistent: bool):
    """Yields ``(op, next_key, memory_during)`` for every operation that can run from ``key``."""
    state, opened = key
    floor = max(opened) if persistent and opened else 0
    ops = [Op(kind, stage) for stage in range(1, chain.length + 2)
           for kind in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE)]
    ops += [Op(OpKind.F_ALL, stage, k) for stage in range(1, chain.length + 2)
            for k in range(1, len(chain.stage(stage).options) + 1)]
    ops.append(Op(OpKind.B, max(state.delta, 1)))
    for op in ops:
        if persistent and (op.stage < floor or (op.kind is OpKind.F_NONE and op.stage == floor)):
            continue
        try:
            after, during = step(chain, state, op)
        except StepError:
            continue
        if persistent:
            if op.kind in (OpKind.F_ALL, OpKind.F_CK):
                yield op, (after, opened | {op.stage}), during
            elif op.kind is OpKind.B:
                yield op, (after, opened - {op.stage}), during
            else:
                yield op, (after, opened), during
        else:
            yield op, (after, opened), during


def search(chain: Chain, budget_bytes: int, *, persistent: bool = False) -> ExactResult | None:
    """The fastest valid sequence whose memory never exceeds ``budget_bytes``, or ``None``.

    Raises:
        SearchTooLargeError: more than ``MAX_STAGES`` stages, or more than ``MAX_STATES`` states.
    """
    _check_size(chain)
    start: _Key = (initial_state(chain), frozenset())
    if start[0].live_bytes > budget_bytes:
        return None
    best = {start: 0.0}
    parent: dict[_Key, tuple[_Key, Op, int]] = {}
    counter = itertools.count()
    queue = [(0.0, next(counter), start)]
    while queue:
        time_ms, _, key = heapq.heappop(queue)
        if time_ms > best[key]:
            continue
        if key[0].delta == 0:
            return _result(chain, key, parent, time_ms)
        for op, after, during in _moves(chain, key, persistent):
            if during > budget_bytes:
                continue
            cost = time_ms + duration_ms(chain, key[0], op)
            if cost < best.get(after, float("inf")):
                best[after] = cost
                parent[after] = (key, op, during)
                heapq.heappush(queue, (cost, next(counter), after))
        if len(best) > MAX_STATES:
            raise SearchTooLargeError(f"exhaustive search visited more than {MAX_STATES} states; use a smaller chain")
    return None


def duration_ms(chain: Chain, state: MemoryState, op: Op) -> float:
    """The time of ``op`` from ``state``: ``B(l)`` also recomputes what its stage's recording option dropped."""
    stage = chain.stage(op.stage)
    if op.kind is OpKind.B:
        return stage.backward_ms + stage.recompute_ms_with(state.option_of(op.stage))
    return stage.forward_ms


def _result(chain: Chain, key: _Key, parent: dict, makespan_ms: float) -> ExactResult:
    ops, peak = [], initial_state(chain).live_bytes
    while key in parent:
        key, op, during = parent[key]
        ops.append(op)
        peak = max(peak, during)
    return ExactResult(tuple(reversed(ops)), makespan_ms, peak)


def min_budget_bytes(chain: Chain, slots: int = 0, *, persistent: bool = False) -> int:
    """The smallest peak of any valid sequence (a minimax search; ``slots`` is unused)."""
    _check_size(chain)
    start: _Key = (initial_state(chain), frozenset())
    best = {start: start[0].live_bytes}
    counter = itertools.count()
    queue = [(best[start], next(counter), start)]
    while queue:
        peak, _, key = heapq.heappop(queue)
        if peak > best[key]:
            continue
        if key[0].delta == 0:
            return peak
        for _, after, during in _moves(chain, key, persistent):
            new_peak = max(peak, during)
            if new_peak < best.get(after, float("inf")):
                best[after] = new_peak
                heapq.heappush(queue, (new_peak, next(counter), after))
    raise AssertionError("store-all is always valid, so some sequence must end")  # pragma: no cover


def plan(chain: Chain, budget_bytes: int, slots: int = 0) -> Plan:
    """The exact optimum within ``budget_bytes`` (small chains only).

    Raises:
        InfeasibleBudgetError: no valid sequence fits.
        SearchTooLargeError: the chain is too long for exhaustive search.
    """
    found = search(chain, budget_bytes)
    if found is None:
        raise infeasible("exact", budget_bytes, min_budget_bytes(chain))
    return Plan(found.ops, ScheduleParams(search="exhaustive"))
