"""What a partial replay holds at its peak (planner.discovery.replay_peak): by hand, and its bounds on random
graphs; the executor's measured replay is held to it in tests/planner/executor/test_selective_execution.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.discovery.cone import StageGraph, cone
from planner.discovery.replay_peak import replay_overhead_bytes, replay_peak_bytes
from tests.planner.discovery.test_cone import graphs_and_kept

# x = linear(input) (kept), t = x * 2, u = t + 1 (the backward reads it), v = tanh(u), out = v * x (the output)
GELU_LIKE = StageGraph(reads=((), (0,), (1,), (2,), (3, 0)), writes=((), (), (), (), ()), needed=frozenset({2}))
SIZES = (8, 8, 8, 8, 8)


def test_a_temporary_and_a_kept_output_no_backward_reads_sit_above_abar() -> None:
    # held: x and out (16); replay t (24), then u (32) before t goes; a-bar = u + out = 16
    assert cone(GELU_LIKE, {0, 4}) == {1, 2}
    assert replay_peak_bytes(GELU_LIKE, SIZES, {0, 4}) == 32
    assert replay_overhead_bytes(GELU_LIKE, SIZES, {0, 4}, abar_bytes=16) == 16
    # keeping u as well: nothing to replay, the peak is what is held
    assert replay_peak_bytes(GELU_LIKE, SIZES, {0, 2, 4}) == 24
    # keeping only the output: x is replayed too and goes once t is made (out's own read of x is not replayed):
    # out + x + t, then out + t + u
    assert replay_peak_bytes(GELU_LIKE, SIZES, {4}) == 24


def test_a_temporary_goes_after_its_last_reader() -> None:
    # a chain of 6 temporaries, the last one read by the backward: two alive at a time beside the output
    graph = StageGraph(reads=((), (0,), (1,), (2,), (3,), (4,), (5,)), writes=((),) * 7, needed=frozenset({5}))
    assert replay_peak_bytes(graph, (4,) * 7, {6}) == 4 + 2 * 4


@settings(max_examples=300, deadline=None)
@given(graphs_and_kept(), st.lists(st.integers(0, 64), min_size=8, max_size=8))
def test_the_peak_lies_between_what_stays_and_everything_the_replay_makes(case, sizes: list[int]) -> None:
    graph, kept = case
    sizes = sizes[: len(graph.reads)]
    held = kept | {len(graph.reads) - 1}
    peak = replay_peak_bytes(graph, sizes, held)
    replayed = cone(graph, held)
    stays = held | (graph.needed & replayed)
    assert sum(sizes[p] for p in stays) <= peak <= sum(sizes[p] for p in held | replayed)
