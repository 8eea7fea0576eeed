"""A slow, obviously correct cone: simulate replays of a stage graph op by op and find the smallest that works.

Every op's output and every in-place write is a symbolic value: the op's name with the values it read. The
forward gives each output its final value; a replay that runs a set of ops in forward order, starting from the
kept outputs' values alone (outputs made outside the stage are not in the graph), is right when every needed
output that is not kept ends with its forward value. The reference cone is the smallest such set, found by
trying every set of ops from the smallest up (graphs of a few ops only).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import combinations

from planner.discovery.cone import StageGraph

Value = tuple


def _run(graph: StageGraph, ops: Collection[int], start: dict[int, Value]) -> dict[int, Value]:
    """The values after running ``ops`` in forward order from ``start`` (a missing value reads as None)."""
    values = dict(start)
    for p in sorted(ops):
        inputs = tuple(values.get(r) for r in graph.reads[p])
        values[p] = ("out", p, inputs)
        for s in graph.writes[p]:
            values[s] = ("write", p, inputs)
    return values


def replay_is_right(graph: StageGraph, kept: Collection[int], ops: Collection[int]) -> bool:
    """Whether running ``ops`` rebuilds every needed output that is not kept, as the forward left it."""
    forward = _run(graph, range(len(graph.reads)), {})
    rebuilt = _run(graph, ops, {s: forward[s] for s in kept})
    return all(rebuilt.get(s) == forward[s] for s in graph.needed if s not in kept)


def smallest_replays(graph: StageGraph, kept: Collection[int]) -> list[frozenset[int]]:
    """Every right replay of the smallest size (kept outputs are never run)."""
    free = [p for p in range(len(graph.reads)) if p not in kept]
    for size in range(len(free) + 1):
        found = [frozenset(ops) for ops in combinations(free, size) if replay_is_right(graph, kept, ops)]
        if found:
            return found
    raise AssertionError("running every op that is not kept always rebuilds the forward")
