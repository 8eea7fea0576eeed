"""The ranks view of a distributed run with many ranks and iterations: summary text, decimated lines, caching."""

from __future__ import annotations

import pytest

from dashboard import callbacks as cb
from dashboard.cache import BoundedCache
from dashboard.data import RANK_VIEW_POINTS, TraceStore, rank_view_points
from memprof.schema import ITERATIONS
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.units import format_bytes
from tests.dashboard.fixtures import meta
from tests.memprof.trace.ranks.many_ranks import iteration_table, reference_summary, write_many_ranks

RANKS, ITERATIONS_PER_RANK = 8, 9_000


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    write_many_ranks(root / "big", RANKS, ITERATIONS_PER_RANK, part_rows=2_000)
    return root


def test_the_view_names_the_highest_rank_its_module_and_iteration(traces):
    style, text, fig = cb.ranks_view(TraceStore(traces, BoundedCache()), ["big/rank=3"])
    summary = reference_summary(traces / "big").set_index("rank")
    high = int(summary.peak_allocated_bytes.idxmax())
    top = summary.loc[high]
    assert style == {"display": "block"}
    assert text.startswith(f"{RANKS} ranks. Rank {high} peaks highest at {format_bytes(top.peak_allocated_bytes)} "
                           f"in {top.peak_module or 'no module'} ({top.peak_phase}, iteration {top.peak_iteration})")
    assert "no iteration yet" not in text
    assert [t.name for t in fig.data] == [f"rank {r}" for r in range(RANKS)]
    assert "highest of its stretch" in fig.layout.title.text
    for rank, trace in enumerate(fig.data):
        assert len(trace.y) <= rank_view_points(RANKS) < ITERATIONS_PER_RANK
        assert max(trace.y) == summary.loc[rank].peak_allocated_bytes  # decimation keeps every peak
        assert trace.mode == "lines"
    assert fig.data[high].line.width > fig.data[(high + 1) % RANKS].line.width


def test_points_are_shared_out_between_ranks():
    assert rank_view_points(2) == 2_000 and rank_view_points(64) == RANK_VIEW_POINTS // 64
    assert rank_view_points(100_000) == 100


def test_the_scan_is_cached_until_a_rank_changes(tmp_path):
    write_many_ranks(tmp_path / "run", 2, 100, part_rows=50)
    store = TraceStore(tmp_path, BoundedCache())
    first = store.rank_peaks("run/rank=0")
    assert store.rank_peaks("run/rank=1") is first and first.nbytes > 0
    assert store.cache.size_bytes >= first.nbytes
    TraceWriter(tmp_path / "run" / "rank=1").append(ITERATIONS, iteration_table(1, 100, 10))
    again = store.rank_peaks("run/rank=0")
    assert again is not first and again.summary.iterations.tolist() == [100, 110]


def test_ranks_without_iterations_and_unreadable_ranks_are_said(tmp_path):
    write_many_ranks(tmp_path / "run", 2, 100, part_rows=50)
    (tmp_path / "run" / "rank=2").mkdir()
    write_meta(tmp_path / "run" / "rank=2", meta("many", rank=2, world_size=3))
    store = TraceStore(tmp_path, BoundedCache())
    _, text, _ = cb.ranks_view(store, ["run/rank=0"])
    assert text.startswith("2 ranks.") and text.endswith("1 more rank has no iteration yet.")
    (tmp_path / "run" / "rank=2" / "meta.json").write_text("{not json")
    style, text, _ = cb.ranks_view(TraceStore(tmp_path, BoundedCache()), ["run/rank=0"])
    assert style == {"display": "block"} and text.startswith("Cannot compare the ranks of run/rank=0: rank 2 ")


@pytest.mark.filterwarnings("ignore:run .* damaged part:RuntimeWarning")
def test_a_damaged_part_of_another_rank_is_left_out_with_one_line(tmp_path):
    """As a single run's damaged part (tests/dashboard/test_run_health.py): garbage in one rank's part."""
    import os

    from memprof.trace.parts import table_parts

    write_many_ranks(tmp_path / "run", 3, 100, part_rows=50)
    table_parts(tmp_path / "run" / "rank=1", ITERATIONS)[0].write_bytes(os.urandom(3000))  # its spike is in [1]
    store = TraceStore(tmp_path, BoundedCache())
    style, text, fig = cb.ranks_view(store, ["run/rank=0"])
    assert style == {"display": "block"} and text.startswith("3 ranks. Rank 1 peaks highest")
    assert text.endswith(" Left out: 1 damaged part skipped: lost iterations 0-49 entirely "
                         "(rank=1/iterations.parquet/part-000001.parquet: not a readable Parquet file (truncated, "
                         "overwritten or written by another tool)).")
    assert str(tmp_path) not in text and "Error" not in text
    assert [len(trace.y) for trace in fig.data] == [100, 50, 100]  # the other ranks and parts are all drawn
    assert store.rank_peaks("run/rank=2").summary.iterations.tolist() == [100, 50, 100]
