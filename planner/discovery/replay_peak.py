"""What a partial replay holds at its peak: the memory rule of ``B(l)``'s recomputation after a partial option.

The executor's replay (:mod:`planner.executor.partial`) runs, at the first unpack of one of the stage's dropped
saved tensors, the cone of every dropped tensor the backward reads (:func:`planner.discovery.cone.cone`), in
forward order, without autograd. While it runs the stage holds its kept outputs (and its own output); each
replayed op adds its output, a replayed temporary goes after its last reader in the replay, a dropped saved
tensor stays (autograd reads it next). Once the replay ends the kept outputs no backward reads are released.
The peak therefore sits above a-bar^l (everything the backward reads) by the temporaries alive at the worst
moment and by those kept outputs. On the test suite's GPT-2, whose last block's replay runs first in the
backward, keeping the matmuls' outputs ("compute") holds 320 KiB above a-bar^l there; charging the stage's
forward overhead instead put the whole step's peak 69 KiB too low.

Sizes are the op records' ``output_bytes`` (by storage: a view's reader reads the op that allocated it), in
positions of the stage's records as :class:`~planner.discovery.cone.StageGraph` has them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from planner.discovery.cone import StageGraph, cone


def replay_peak_bytes(graph: StageGraph, sizes: Sequence[int], held: Collection[int]) -> int:
    """The most the stage's tensors hold during the replay that follows a forward keeping ``held``.

    Args:
        graph: the stage's graph.
        sizes: bytes each op's outputs allocated, by position.
        held: positions whose outputs the forward kept (the stage's output among them).
    """
    held = frozenset(held)
    order = sorted(cone(graph, held))
    inputs = {p: (*graph.reads[p], *graph.writes[p]) for p in order}
    last_reader = {j: p for p in order for j in inputs[p]}
    alive = set(held)
    now = sum(sizes[j] for j in alive)
    peak = now
    for p in order:
        alive.add(p)
        now += sizes[p]
        peak = max(peak, now)
        for j in (*inputs[p], p):
            if j in alive and j not in held and j not in graph.needed and last_reader.get(j, -1) <= p:
                alive.discard(j)
                now -= sizes[j]
    return peak


def replay_overhead_bytes(graph: StageGraph, sizes: Sequence[int], held: Collection[int],
                          abar_bytes: int) -> int:
    """What the replay holds at its peak above ``abar_bytes`` (a-bar^l as the trace measured it), >= 0."""
    return max(replay_peak_bytes(graph, sizes, held) - abar_bytes, 0)
