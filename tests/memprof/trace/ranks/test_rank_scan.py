"""The streaming pass over every rank against the reference that loads every rank whole with pandas."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memprof import CorruptTraceError, RankTraceError, TraceError
from memprof.schema import ITERATIONS, table_dir_name
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.trace.ranks import peak_imbalance, rank_peaks, rank_summary, scan_ranks
from memprof.trace.ranks import plan as rank_plan
from memprof.trace.ranks import scan as rank_scan
from memprof.trace.ranks.aggregate import RankAggregate, merge_intervals, runs_of
from tests.dashboard.fixtures import meta
from tests.memprof.trace.ranks.many_ranks import (
    iteration_table,
    reference_frame,
    reference_peaks,
    reference_summary,
    write_many_ranks,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three layouts of one 5-rank run: small parts, merged parts of several row groups, a part written twice."""
    root = tmp_path_factory.mktemp("ranks")
    return {"parts": write_many_ranks(root / "parts", 5, 1200, part_rows=100),
            "compacted": write_many_ranks(root / "compacted", 5, 1200, part_rows=500, row_group_rows=128),
            "rewritten": write_many_ranks(root / "rewritten", 5, 1200, part_rows=300, rewritten=150)}


@pytest.mark.parametrize("layout", ["parts", "compacted", "rewritten"])
@pytest.mark.parametrize("max_points", [1, 7, 100, 1200, 5000, None])
def test_the_pass_matches_the_reference(runs, layout, max_points):
    run = runs[layout]
    found = scan_ranks(run, max_points)
    pd.testing.assert_frame_equal(found.summary, reference_summary(run))
    pd.testing.assert_frame_equal(found.peaks, reference_peaks(run, max_points))
    assert found.ranks == (0, 1, 2, 3, 4) and found.max_points == max_points
    assert (found.summary.iterations == 1200).all()  # a rewritten iteration is counted once
    assert found.peaks.groupby("rank").size().max() <= (max_points or 1200)


def test_the_spike_and_the_imbalance(runs):
    run = runs["rewritten"]
    summary = rank_summary(run)
    spike = summary.set_index("rank").loc[2]  # iteration_table puts one spike on rank ranks // 2
    assert (spike.peak_allocated_bytes, spike.peak_iteration) == (400 << 20, 800)
    assert summary.peak_allocated_bytes.idxmax() == 2
    full = reference_frame(run)
    assert peak_imbalance(summary) == peak_imbalance(full) == peak_imbalance(rank_peaks(run, 10))
    assert peak_imbalance(summary).highest_rank == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_parts_with_gaps_and_copies(tmp_path_factory, data):
    """Random iterations per rank (gaps, copies across parts, parts out of order) give the reference's answer."""
    run = tmp_path_factory.mktemp("random")
    for rank in range(data.draw(st.integers(1, 3), "ranks")):
        writer = TraceWriter(run / f"rank={rank}")
        table = iteration_table(rank, 0, 60)
        for _ in range(data.draw(st.integers(0, 4), f"parts of {rank}")):
            rows = data.draw(st.lists(st.integers(0, 59), min_size=1, max_size=40, unique=True), "rows")
            writer.append(ITERATIONS, table.take(sorted(rows) if data.draw(st.booleans()) else rows))
        write_meta(run / f"rank={rank}", meta("random", rank=rank, world_size=3))
    max_points = data.draw(st.sampled_from([1, 3, 16, None]), "max_points")
    found = scan_ranks(run, max_points)
    if not any(run.glob("rank=*/iterations.parquet/*.parquet")):
        assert found.summary.empty and found.peaks.empty
        return
    pd.testing.assert_frame_equal(found.summary, reference_summary(run))
    pd.testing.assert_frame_equal(found.peaks, reference_peaks(run, max_points))


def test_a_rank_without_iterations_has_no_row(tmp_path):
    run = write_many_ranks(tmp_path / "run", 2, 50, part_rows=20)
    (run / "rank=2").mkdir()
    write_meta(tmp_path / "run" / "rank=2", meta("many", rank=2, world_size=3))
    found = scan_ranks(run)
    assert found.ranks == (0, 1, 2)
    assert found.summary["rank"].tolist() == [0, 1] and set(found.peaks["rank"]) == {0, 1}


def test_iterations_in_a_journal_are_counted(tmp_path, monkeypatch):
    """A killed rank's journaled iterations (some also written) count once and can hold the peak."""
    run = write_many_ranks(tmp_path / "run", 2, 100, part_rows=40)
    journal = iteration_table(1, 90, 20).to_pylist()  # 90..99 written already, 100..109 only journaled
    journal[15]["peak_allocated_bytes"] = 900 << 20
    journal[15]["peak_module"], journal[15]["peak_phase"] = "journaled", "backward"
    items = [SimpleNamespace(row=row, iteration=row["iteration"], before=None) for row in journal]

    def recover(run_dir):
        return items if run_dir.name == "rank=1" else []

    monkeypatch.setattr(rank_plan, "recover", recover)
    monkeypatch.setattr("memprof.trace.reader.recover", recover)
    found = scan_ranks(run, max_points=None)
    pd.testing.assert_frame_equal(found.summary, reference_summary(run))
    pd.testing.assert_frame_equal(found.peaks, reference_peaks(run, None))
    top = found.summary.set_index("rank").loc[1]
    assert (top.iterations, top.peak_iteration, top.peak_module, top.peak_phase) == (110, 105, "journaled", "backward")


def _broken(tmp_path):
    return write_many_ranks(tmp_path / "run", 3, 300, part_rows=100)


def _part(run, rank, number=2):
    return run / f"rank={rank}" / table_dir_name(ITERATIONS) / f"part-{number:06d}.parquet"


def _damage(part, how):
    """Makes ``part`` unreadable: its footer cut off, or its data pages failing their checksums."""
    if how == "truncated":
        part.write_bytes(part.read_bytes()[:-100])
    else:  # the footer reads, the data pages fail their checksums
        data = bytearray(part.read_bytes())
        for offset in range(100, 2000, 7):
            data[offset] ^= 0xFF
        part.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["no meta", "truncated", "missing column", "damaged pages", "foreign meta"])
def test_an_unreadable_rank_is_named(tmp_path, damage):
    """A rank that is not a memprof trace is refused; so is a damaged part by a strict scan."""
    run = _broken(tmp_path)
    part = _part(run, 1)
    if damage == "no meta":
        (run / "rank=1" / "meta.json").unlink()
    elif damage == "foreign meta":
        (run / "rank=1" / "meta.json").write_text('{"format": "other"}')
    elif damage == "missing column":  # a readable part of another shape: another tool's file, not damage
        pq.write_table(pq.read_table(part).drop_columns(["peak_reserved_bytes"]), part)
    else:
        _damage(part, damage)
    with pytest.raises(RankTraceError, match=r"rank 1 .*cannot be read") as caught:
        scan_ranks(run, strict=True)
    assert caught.value.rank == 1 and isinstance(caught.value, TraceError)
    assert "rank=1" in str(caught.value)
    if damage in ("truncated", "damaged pages"):
        with pytest.raises(RankTraceError, match="rank 1"):
            rank_summary(run, strict=True)
    else:
        with pytest.raises(RankTraceError, match=r"rank 1 .*cannot be read"):
            scan_ranks(run)


@pytest.mark.parametrize("damage", ["truncated", "damaged pages"])
def test_a_damaged_part_is_left_out_with_one_warning(tmp_path, damage):
    """As load_trace does: the rank loses the part's iterations, the other ranks and parts are all there."""
    run = _broken(tmp_path)
    _damage(_part(run, 1), damage)
    with pytest.warns(RuntimeWarning) as caught:
        found = scan_ranks(run, 10)
    said = [str(w.message) for w in caught if "damaged part" in str(w.message)]
    assert said == [f"run run: {found.damage_message}"]  # one warning, naming the part
    reason = "not a readable Parquet file" if damage == "truncated" else "a damaged page (failed its checksum)"
    assert found.damage_message.startswith(f"1 damaged part skipped: lost iterations 100-199 entirely "
                                           f"(rank=1/iterations.parquet/part-000002.parquet: {reason}")
    assert [(d.table, d.part, d.iterations) for d in found.damage] == [
        ("iterations", "rank=1/iterations.parquet/part-000002.parquet", tuple(range(100, 200)))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference (load_trace) skips the part too
        expected_summary, expected_peaks = reference_summary(run), reference_peaks(run, 10)
    pd.testing.assert_frame_equal(found.summary, expected_summary)
    pd.testing.assert_frame_equal(found.peaks, expected_peaks)
    assert found.summary.iterations.tolist() == [300, 200, 300]


def test_a_damaged_label_column_is_named(tmp_path):
    """Only the peak's iteration is decoded for its module: damage there leaves its part out, or (strict) names
    the rank."""
    run = _broken(tmp_path)
    peak_iteration = int(rank_summary(run).set_index("rank").loc[0].peak_iteration)
    part = _part(run, 0, peak_iteration // 100 + 1)
    table = pq.read_table(part)
    data = bytearray(part.read_bytes())
    start = data.find(b"encoder")  # inside the peak_module column's page
    data[start:start + 4] = b"\xff\xff\xff\xff"
    part.write_bytes(bytes(data))
    assert pq.read_table(part, columns=["iteration"]).equals(table.select(["iteration"]))
    with pytest.raises(RankTraceError, match="rank 0") as caught:
        rank_summary(run, strict=True)
    assert caught.value.rank == 0
    with pytest.warns(RuntimeWarning, match="damaged part"):
        found = scan_ranks(run, 10)
    lost = range(part_first := (peak_iteration // 100) * 100, part_first + 100)
    assert found.damage[0].iterations == tuple(lost)  # its numbers were read: the whole part is left out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pd.testing.assert_frame_equal(found.summary, reference_summary(run))
    assert found.summary.set_index("rank").loc[0].peak_iteration not in lost


def test_a_run_without_ranks_and_a_bad_limit_are_refused(tmp_path):
    with pytest.raises(TraceError, match="rank=<r>"):
        scan_ranks(tmp_path)
    with pytest.raises(ValueError, match="max_points"):
        scan_ranks(_broken(tmp_path), 0)


def test_parts_that_vanish_make_the_pass_start_again(tmp_path, monkeypatch):
    run = _broken(tmp_path)
    plans = [rank_scan.plan_rank(rank, run / f"rank={rank}") for rank in range(3)]
    _part(run, 2).unlink()
    with pytest.raises(rank_scan.PartsChanged):
        rank_scan.scan(run, plans, 10)
    expected = reference_summary(run)
    calls = []
    real = rank_scan.scan

    def flaky(*args):
        calls.append(1)
        if len(calls) == 1:
            raise rank_scan.PartsChanged("merged by a compaction")
        return real(*args)

    monkeypatch.setattr(rank_scan, "scan", flaky)
    pd.testing.assert_frame_equal(rank_summary(run), expected)
    assert len(calls) == 2
    monkeypatch.setattr(rank_scan, "scan", lambda *args: (_ for _ in ()).throw(rank_scan.PartsChanged("again")))
    with pytest.raises(CorruptTraceError, match="changed during"):
        rank_summary(run)


def test_a_part_without_statistics_is_read_for_its_span(tmp_path):
    run = _broken(tmp_path)
    part = _part(run, 1)
    pq.write_table(pq.read_table(part), part, write_statistics=False)
    pd.testing.assert_frame_equal(scan_ranks(run, 4).peaks, reference_peaks(run, 4))


def test_intervals_count_each_iteration_once():
    assert runs_of(np.array([5, 3, 4, 9, 9, 10, 1])) == [(1, 1), (3, 5), (9, 10)]
    assert runs_of(np.array([1, 2, 2, 3, 7]), ordered=True) == [(1, 3), (7, 7)]
    assert merge_intervals([(0, 4), (10, 12)], [(5, 6), (11, 20), (30, 30)]) == [(0, 6), (10, 20), (30, 30)]
    aggregate = RankAggregate.start(0, 0, 9, max_points=3)
    aggregate.add(np.array([0, 1, 2, 3]), np.array([5, 9, 9, 1]), np.array([1, 1, 1, 1]))
    aggregate.add(np.array([8, 3, 2]), np.array([4, 1, 9]), np.array([2, 7, 1]))  # out of order, copies
    assert aggregate.iterations == 5 and (aggregate.peak_allocated_bytes, aggregate.peak_iteration) == (9, 1)
    assert aggregate.bucket_peak.tolist() == [9, -1, 4] and aggregate.bucket_iteration.tolist() == [1, -1, 8]
    assert aggregate.bucket_reserved.tolist() == [7, -1, 2]
    with pytest.raises(IndexError, match="outside the span"):
        aggregate.add(np.array([12]), np.array([1]), np.array([1]))


def test_a_batch_of_several_ranks_is_split(tmp_path):
    aggregates = {rank: RankAggregate.start(rank, 0, 3, None) for rank in (0, 1)}
    folder = rank_scan._Folder(aggregates)
    folder.push(pa.record_batch({"iteration": [0, 0, 1, 3], "peak_allocated_bytes": [1, 2, 3, 4],
                                 "peak_reserved_bytes": [0, 0, 0, 0], "rank": [0, 1, 0, 1]}))
    folder.flush()
    assert [aggregates[r].bucket_peak.tolist() for r in (0, 1)] == [[1, 3, -1, -1], [2, -1, -1, 4]]
