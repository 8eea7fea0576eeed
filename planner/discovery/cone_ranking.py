"""Which outputs a partial option keeps first: a greedy on what keeping each one spares of the cone.

With partial recomputation (:mod:`planner.discovery.cone`) keeping an op's output spares more than its own
recomputation: every op that was replayed only to rebuild it leaves the cone too (keeping an attention's
softmax output spares the matmul of its scores), and what an output spares depends on what is kept already
(once the softmax is kept, keeping the scores spares nothing). So the ranking is a greedy: keep, one at a
time, the candidate that spares the most of the cone per byte, until keeping more spares nothing.

What keeping ``c`` spares, for every ``c`` of the cone at once: the ops that leave the cone are those every
reason to replay them goes through ``c`` -- the ops ``c`` dominates in the graph of reasons (the backward needs
an output; a running op reads an output; a running op reads what an in-place op writes before it), whose
edges all point to earlier ops, so immediate dominators come from one pass in that order (Cooper, Harvey and
Kennedy's intersection). A candidate's output is never written in place later (the builder does not keep
those), so keeping it removes it from that graph and nothing else. One greedy step is then linear in the
graph's size, not one cone per candidate.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from planner.discovery.cone import StageGraph, cone, cone_weight


def spared(graph: StageGraph, kept: Collection[int], weights: Sequence[float]) -> dict[int, float]:
    """For each op of the cone with ``kept`` kept, the weight that leaves the cone if its output is kept too."""
    members = sorted(cone(graph, kept), reverse=True)  # every reason of an op is a later op (or the backward)
    root = len(graph.reads)
    inside = set(members)
    reasons: dict[int, list[int]] = {v: [root] if v in graph.needed else [] for v in members}
    readers: dict[int, list[int]] = {}
    for r in members:
        for s in graph.reads[r]:
            if s in inside:
                reasons[s].append(r)
                readers.setdefault(s, []).append(r)
    for w in members:
        for s in graph.writes[w]:
            if s in inside:
                reasons[w].extend(r for r in readers.get(s, ()) if r > w)
                if s in graph.needed:
                    reasons[w].append(root)
    number = {root: 0, **{v: i for i, v in enumerate(members, start=1)}}
    idom = {root: root}
    for v in members:
        first, *rest = reasons[v]
        for u in rest:
            first = _intersect(first, u, idom, number)
        idom[v] = first
    weight = {v: float(weights[v]) for v in members}
    for v in reversed(members):  # dominated ops come after their dominator in ``members``
        if idom[v] != root:
            weight[idom[v]] += weight[v]
    return weight


def _intersect(a: int, b: int, idom: Mapping[int, int], number: Mapping[int, int]) -> int:
    while a != b:
        while number[a] > number[b]:
            a = idom[a]
        while number[b] > number[a]:
            b = idom[b]
    return a


def greedy_ranking(graph: StageGraph, candidates: Collection[int], sizes: Mapping[int, int],
                   weights: Sequence[float], held: Collection[int] = ()) -> tuple[list[int], list[float], float]:
    """The candidates in the order a greedy keeps them, each the one sparing the most of the cone per byte.

    Args:
        graph: the stage's graph.
        candidates: positions whose outputs may be kept.
        sizes: the bytes of each candidate's output.
        weights: what each op's replay weighs.
        held: positions kept whatever the option (the stage's own output).

    Returns:
        The ranked candidates (those whose keeping spares something, in the greedy's order), what each
        spared when it was kept, and the cone's weight with only ``held`` kept.
    """
    kept = set(held)
    base = cone_weight(graph, kept, weights)
    remaining = set(candidates) - kept
    order: list[int] = []
    gains: list[float] = []
    while remaining:
        gain = spared(graph, kept, weights)
        scored = [c for c in remaining if gain.get(c, 0.0) > 0.0]
        if not scored:
            break
        best = max(scored, key=lambda c: (gain[c] / max(sizes[c], 1), gain[c], -c))
        kept.add(best)
        remaining.discard(best)
        order.append(best)
        gains.append(gain[best])
    return order, gains, base
