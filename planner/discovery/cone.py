"""The cone of a partial recomputation: the ops a stage's backward replays to rebuild what its option dropped.

A partial option (``StageOption.partial``) keeps some ops' outputs; in backward it replays only what is needed
to rebuild, from the stage's input, its parameters and the kept outputs, every tensor the backward reads
(``OpRecord.needs``) that the option did not keep. That set of ops is the cone: the walk back along
``OpRecord.reads`` from the dropped needed outputs, stopped by kept outputs and by tensors made outside the
stage, plus every in-place write (``OpRecord.writes``) into a storage of the cone before the cone's last
reader of it reads it (for a needed output: any write, since the backward reads its final value), with the
ops that write reads. The executor's replay (:mod:`planner.executor.partial_tape`) walks its own recorded
tape by the same rule; ``tests/planner/discovery/cone_reference.py`` checks this one against a brute-force
replay of small random graphs.

Indexes here are positions in the stage's op records (0-based), as ``StageOption.saves`` are.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from memprof.analysis.op_records import OpRecord
from planner.errors import ChainError


@dataclass(frozen=True, kw_only=True)
class StageGraph:
    """What one stage's ops read, write and leave for the backward, by position in the stage.

    Attributes:
        reads: for each op, the positions of the stage's ops whose outputs (storages) it takes as inputs.
        writes: for each op, the positions of the stage's ops whose outputs it writes in place.
        needed: the positions whose outputs the stage's backward reads.
    """

    reads: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[int, ...], ...]
    needed: frozenset[int]

    def __post_init__(self) -> None:
        n = len(self.reads)
        if len(self.writes) != n:
            raise ChainError(f"a stage graph needs reads and writes for each of its ops; found {n} and {len(self.writes)}")
        for p, (reads, writes) in enumerate(zip(self.reads, self.writes)):
            if any(not 0 <= i < p for i in (*reads, *writes)):
                raise ChainError(f"op {p} of a stage graph reads {reads} and writes {writes}; expected earlier ops only")
        if any(not 0 <= i < n for i in self.needed):
            raise ChainError(f"a stage graph of {n} ops needs {sorted(self.needed)}; expected positions 0..{n - 1}")


def has_reads(ops: Sequence[OpRecord]) -> bool:
    """Whether the records say what every op reads and writes (traces since ``OpRecord.reads``)."""
    return bool(ops) and all(r.reads is not None and r.writes is not None for r in ops)


def stage_graph(ops: Sequence[OpRecord]) -> StageGraph:
    """The graph of a stage's records (global indexes of ops outside the stage are dropped).

    Raises:
        ChainError: a record does not say what it reads or writes (:func:`has_reads` is false).
    """
    if not has_reads(ops):
        raise ChainError("a partial recomputation needs op records with reads and writes; re-record the planning pass")
    position = {record.index: p for p, record in enumerate(ops)}

    def inside(indexes: Sequence[int] | None) -> tuple[int, ...]:
        return tuple(sorted({position[i] for i in indexes or () if i in position}))

    return StageGraph(reads=tuple(inside(r.reads) for r in ops), writes=tuple(inside(r.writes) for r in ops),
                      needed=frozenset(position[i] for r in ops for i in r.needs if i in position))


def cone(graph: StageGraph, kept: Collection[int]) -> frozenset[int]:
    """The positions of the ops a replay runs when the outputs ``kept`` are kept.

    One walk from the last op back: an op runs when a later running op reads its output, or its output is
    needed and not kept, or it writes into an output that a later running op reads (or that is needed). Kept
    outputs are never run and end the walk; ops the stage did not run (its input) are not in the graph.

    Args:
        graph: the stage's graph.
        kept: positions whose outputs are kept (the stage's own output among them: it is held anyway).
    """
    n = len(graph.reads)
    read_until = [-1] * n  # for each output: the latest running op that reads it (n: the backward)
    for p in graph.needed:
        if p not in kept:
            read_until[p] = n
    running: list[int] = []
    for p in range(n - 1, -1, -1):
        if p in kept or (read_until[p] < 0 and not any(read_until[s] > p for s in graph.writes[p])):
            continue
        running.append(p)
        for r in graph.reads[p]:
            if r not in kept:
                read_until[r] = max(read_until[r], p)
    return frozenset(running)


def cone_weight(graph: StageGraph, kept: Collection[int], weights: Sequence[float]) -> float:
    """What replaying :func:`cone` weighs (the sum of its ops' ``weights``)."""
    return sum(weights[p] for p in cone(graph, kept))
