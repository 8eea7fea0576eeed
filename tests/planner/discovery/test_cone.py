"""The cone of a partial recomputation against a brute-force replay, and the greedy's spared weights against
recomputed cones (hypothesis, random small op graphs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprof.analysis.op_records import OpRecord
from planner.discovery.cone import StageGraph, cone, cone_weight, has_reads, stage_graph
from planner.discovery.cone_ranking import greedy_ranking, spared
from planner.errors import ChainError
from tests.planner.discovery.cone_reference import smallest_replays


@st.composite
def graphs_and_kept(draw: st.DrawFn, most: int = 8) -> tuple[StageGraph, frozenset[int]]:
    """A stage graph (an op reads up to 3 earlier outputs and may write some of them in place) and outputs a
    partial option may keep (as the option builder keeps them: never one written in place later, nor one of an
    op that writes in place, whose write a replay would then skip)."""
    n = draw(st.integers(1, most))
    reads: list[tuple[int, ...]] = []
    writes: list[tuple[int, ...]] = []
    for p in range(n):
        read = sorted(draw(st.sets(st.integers(0, p - 1), max_size=3))) if p else []
        written = sorted(draw(st.sets(st.sampled_from(read), max_size=2))) if read else []
        reads.append(tuple(read))
        writes.append(tuple(written))
    needed = draw(st.sets(st.integers(0, n - 1)))
    keepable = sorted(p for p in range(n) if not writes[p] and not any(p in w for w in writes))
    kept = draw(st.sets(st.sampled_from(keepable))) if keepable else set()
    return StageGraph(reads=tuple(reads), writes=tuple(writes), needed=frozenset(needed)), frozenset(kept)


@settings(max_examples=300, deadline=None)
@given(graphs_and_kept())
def test_the_cone_is_the_one_smallest_replay_that_rebuilds_what_the_backward_needs(
        case: tuple[StageGraph, frozenset[int]]) -> None:
    graph, kept = case
    assert smallest_replays(graph, kept) == [cone(graph, kept)]


@settings(max_examples=200, deadline=None)
@given(graphs_and_kept(most=12), st.lists(st.integers(0, 5), min_size=12, max_size=12))
def test_spared_is_what_keeping_one_more_output_takes_out_of_the_cone(
        case: tuple[StageGraph, frozenset[int]], weights: list[int]) -> None:
    graph, kept = case
    keepable = {p for p, w in enumerate(graph.writes) if not w and not any(p in v for v in graph.writes)}
    gains = spared(graph, kept, weights)
    assert set(gains) == cone(graph, kept)
    before = cone_weight(graph, kept, weights)
    for c in set(gains) & keepable:
        assert gains[c] == before - cone_weight(graph, kept | {c}, weights)


@settings(max_examples=100, deadline=None)
@given(graphs_and_kept(most=10), st.lists(st.integers(1, 9), min_size=10, max_size=10))
def test_the_greedy_keeps_what_spares_the_most_per_byte_and_its_gains_add_up(
        case: tuple[StageGraph, frozenset[int]], sizes: list[int]) -> None:
    graph, _ = case
    n = len(graph.reads)
    candidates = sorted(p for p, w in enumerate(graph.writes) if not w and not any(p in v for v in graph.writes))
    weights = [1.0 + p for p in range(n)]
    order, gains, base = greedy_ranking(graph, candidates, dict(enumerate(sizes)), weights)
    assert base == cone_weight(graph, (), weights)
    kept: set[int] = set()
    for c, gain in zip(order, gains, strict=True):
        options = {d: cone_weight(graph, kept, weights) - cone_weight(graph, kept | {d}, weights)
                   for d in candidates if d not in kept}
        best = max(options[d] / sizes[d] for d in options)
        assert gain == options[c] > 0 and gain / sizes[c] == best
        kept.add(c)
    assert all(cone_weight(graph, kept, weights) == cone_weight(graph, kept | {d}, weights)
               for d in candidates if d not in kept), "the greedy stops once keeping more spares nothing"


def test_a_dropout_after_a_softmax_replays_only_the_dropout_when_the_softmax_is_kept() -> None:
    # 0 matmul (scores), 1 softmax (needs its output), 2 empty_like, 3 bernoulli_ (writes 2), 4 div_ (writes 2),
    # 5 mul (dropout output; needs the mask 2), 6 matmul (needs 5)
    graph = StageGraph(reads=((), (0,), (), (2,), (2,), (1, 2), (5,)), writes=((), (), (), (2,), (2,), (), ()),
                       needed=frozenset({1, 2, 5}))
    assert cone(graph, {1}) == {2, 3, 4, 5}
    assert cone(graph, set()) == {0, 1, 2, 3, 4, 5}
    assert cone(graph, {1, 5}) == {2, 3, 4}
    # a write after the last reader of a tensor that is not needed is not replayed
    late = StageGraph(reads=((), (0,), (0,)), writes=((), (), (0,)), needed=frozenset({1}))
    assert cone(late, ()) == {0, 1}


def test_stage_graphs_from_records_keep_the_stages_ops_and_refuse_old_records() -> None:
    records = [
        OpRecord(index=5, module="b", op="aten.mm.default", output_bytes=8, reads=(2,), writes=()),  # 2: before the stage
        OpRecord(index=6, module="b", op="aten.relu.default", output_bytes=8, needs=(6,), reads=(5,), writes=()),
        OpRecord(index=7, module="b", op="aten.add_.Tensor", output_bytes=0, reads=(6, 5), writes=(6,)),
    ]
    assert has_reads(records)
    graph = stage_graph(records)
    assert graph.reads == ((), (0,), (0, 1)) and graph.writes == ((), (), (1,)) and graph.needed == {1}
    old = [OpRecord(index=0, module="b", op="aten.mm.default", output_bytes=8)]
    assert not has_reads(old) and not has_reads([])
    with pytest.raises(ChainError, match="reads and writes"):
        stage_graph(old)
    with pytest.raises(ChainError, match="expected earlier ops only"):
        StageGraph(reads=((0,),), writes=((),), needed=frozenset())
