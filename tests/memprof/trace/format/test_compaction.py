"""Compaction keeps every table within its documented number of parts and every row readable, once."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memprof.trace.format.compaction
import memprof.trace.parts
import memprof.trace.reader
from memprof.schema import EVENTS, ITERATIONS, LAYERS, SCHEMAS, TABLES
from memprof.trace.format.compaction import CompactionPolicy, Part, parse_part_name, part_name
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.trace.reader import load_run, table_parts
from tests.dashboard.fixtures import meta

FLUSHES = 5000
ITERATIONS_PER_FLUSH = 2
DETAIL_EVERY = 50  # layers and events hold rows for every 50th iteration only, as a detail policy would


def synthetic(table: str, iterations: Sequence[int], rows_per_iteration: int = 1, version: int = 0) -> pa.Table:
    """Rows of ``table`` for ``iterations`` whose every value tells its iteration, row and ``version``."""
    its = np.repeat(np.asarray(iterations, dtype=np.int64), rows_per_iteration)
    seq = np.tile(np.arange(rows_per_iteration, dtype=np.int64), len(iterations))
    arrays = []
    for f in SCHEMAS[table]:
        if f.name == "iteration":
            arrays.append(pa.array(its, f.type))
        elif f.name == "seq":
            arrays.append(pa.array(seq, f.type))
        elif pa.types.is_integer(f.type):
            arrays.append(pa.array(its * 1000 + seq * 10 + version, f.type))
        elif pa.types.is_floating(f.type):
            arrays.append(pa.array(its + seq / 100 + version / 10, f.type))
        elif pa.types.is_boolean(f.type):
            arrays.append(pa.array(its % DETAIL_EVERY == 0, f.type))
        elif pa.types.is_list(f.type):
            arrays.append(pa.array([[int(i), int(s), version] for i, s in zip(its, seq)], f.type))
        else:
            arrays.append(pa.array([f"{f.name}-{i}-{s}-{version}" for i, s in zip(its, seq)], f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMAS[table])


def rows_per_iteration(table: str) -> int:
    return {ITERATIONS: 1, LAYERS: 2, EVENTS: 3}[table]


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists as tuples, so that frames compare with ``assert_frame_equal``."""
    frame = frame.reset_index(drop=True)
    for name in frame.columns:
        if frame[name].dtype == object and len(frame) and not isinstance(frame[name].iloc[0], str):
            frame[name] = frame[name].map(tuple)
    return frame


def assert_same_rows(found: pd.DataFrame, expected: pa.Table | pd.DataFrame) -> None:
    expected_frame = expected.to_pandas() if isinstance(expected, pa.Table) else expected
    pd.testing.assert_frame_equal(_plain(found), _plain(expected_frame), check_dtype=False)


def levels(appended: int, fan_in: int) -> int:
    """floor(log_F N) + 1, in integers."""
    count = 0
    while appended >= fan_in ** count:
        count += 1
    return count


def bound(policy: CompactionPolicy, appended: int, rows: int, size_bytes: int) -> float:
    """The documented bound on a table's parts (memprof.trace.format.compaction's docstring)."""
    if appended == 0:
        return 0
    return ((policy.fan_in - 1) * levels(appended, policy.fan_in)
            + policy.fan_in * (rows / policy.max_rows + size_bytes / policy.max_bytes))


def digit_sum(n: int, base: int) -> int:
    total = 0
    while n:
        n, digit = divmod(n, base)
        total += digit
    return total


def table_size(run_dir: Path, table: str) -> tuple[int, int, int]:
    """Parts, rows and bytes of a table on disk."""
    parts = table_parts(run_dir, table)
    return len(parts), sum(pq.read_metadata(p).num_rows for p in parts), sum(p.stat().st_size for p in parts)


class LongRun:
    """A run of many synthetic flushes, with what was appended to each table."""

    def __init__(self, run_dir: Path, policy: CompactionPolicy | None = None) -> None:
        self.run_dir = run_dir
        self.writer = TraceWriter(run_dir, policy)
        write_meta(run_dir, meta("long"))
        self.appended: dict[str, list[pa.Table]] = {t: [] for t in TABLES}
        self.parts: dict[str, int] = dict.fromkeys(TABLES, 0)

    def flush(self, iterations: Sequence[int], detailed: Sequence[int], compact: bool = True) -> None:
        """Appends one flush (the detail tables first, as ``write_iterations`` does) and compacts."""
        for table, its in ((LAYERS, detailed), (EVENTS, detailed), (ITERATIONS, iterations)):
            if not its:
                assert self.writer.append(table, []) is None  # an empty flush writes no part
                continue
            data = synthetic(table, its, rows_per_iteration(table))
            self.writer.append(table, data)
            self.appended[table].append(data)
            self.parts[table] += 1
        if compact:
            self.writer.compact()

    def expected(self, table: str) -> pa.Table:
        return pa.concat_tables(self.appended[table]) if self.appended[table] else SCHEMAS[table].empty_table()


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> LongRun:
    run = LongRun(tmp_path_factory.mktemp("long") / "run")
    for flush in range(FLUSHES):
        its = list(range(flush * ITERATIONS_PER_FLUSH, (flush + 1) * ITERATIONS_PER_FLUSH))
        run.flush(its, [i for i in its if i % DETAIL_EVERY == 0])
    return run


@pytest.mark.slow
def test_long_run_stays_within_the_bound(long_run):
    policy = long_run.writer.policy
    for table in TABLES:
        count, rows, size_bytes = table_size(long_run.run_dir, table)
        appended = long_run.parts[table]
        assert count <= bound(policy, appended, rows, size_bytes), (table, count, appended)
        # below the caps the parts are the base-F digits of the number of appended parts
        assert count == digit_sum(appended, policy.fan_in), (table, count, appended)
        assert count == len(long_run.writer.parts(table))
    assert long_run.parts[ITERATIONS] == FLUSHES and table_size(long_run.run_dir, ITERATIONS)[0] <= 7 * 5


@pytest.mark.slow
def test_long_run_reads_back_every_row_in_iteration_order(long_run):
    trace = load_run(long_run.run_dir)
    for table in TABLES:
        assert_same_rows(trace.read(table), long_run.expected(table))
    assert trace.iterations.iteration.tolist() == list(range(FLUSHES * ITERATIONS_PER_FLUSH))
    assert trace.detail_iterations == list(range(0, FLUSHES * ITERATIONS_PER_FLUSH, DETAIL_EVERY))


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 50, 4096, 9950, 9999])
def test_reading_one_iteration_of_a_long_run(long_run, k):
    trace = load_run(long_run.run_dir)
    for table in TABLES:
        expected = synthetic(table, [k], rows_per_iteration(table)) if table == ITERATIONS or k % DETAIL_EVERY == 0 \
            else SCHEMAS[table].empty_table()
        assert_same_rows(trace.read(table, iterations=[k]), expected)
    assert trace.read(EVENTS, columns=["seq"], iterations=[k]).seq.tolist() == ([0, 1, 2] if k % 50 == 0 else [])


def test_merged_parts_have_ordered_row_groups_with_iteration_statistics(tmp_path):
    policy = CompactionPolicy(fan_in=4, row_group_rows=50)
    run = LongRun(tmp_path / "run", policy)
    for flush in range(64):
        run.flush([2 * flush, 2 * flush + 1], [2 * flush, 2 * flush + 1])
    (merged,) = table_parts(run.run_dir, EVENTS)  # 64 = 4**3: one tier-3 part
    assert parse_part_name(merged.name) == (1, 64, 3)
    metadata = pq.read_metadata(merged)
    assert metadata.num_row_groups == 128 * 3 // 50 + 1
    column = metadata.schema.to_arrow_schema().get_field_index("iteration")
    ranges = []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        assert stats is not None and stats.has_min_max
        assert metadata.row_group(group).column(column).compression == "SNAPPY"
        ranges.append((stats.min, stats.max))
    assert all(high <= low for (_, high), (low, _) in zip(ranges, ranges[1:]))  # ordered by iteration
    trace = load_run(run.run_dir)
    for k in (0, 37, 127):
        frame = trace.read(EVENTS, iterations=[k])
        assert_same_rows(frame, synthetic(EVENTS, [k], 3))
    # events keep their seq order within each iteration
    events = trace.events
    assert (events.groupby("iteration").seq.apply(list) == pd.Series([[0, 1, 2]] * 128)).all()


def test_a_rewritten_iteration_keeps_its_last_rows_through_merges(tmp_path):
    # An inline takeover writes again, one per part, iterations whose batch a dead worker wrote in part.
    run = LongRun(tmp_path / "run", CompactionPolicy(fan_in=2))
    writer = run.writer
    writer.append(EVENTS, synthetic(EVENTS, range(0, 8), 3))  # the dead worker's detail, never finished
    for iteration in range(0, 8):
        writer.append(EVENTS, synthetic(EVENTS, [iteration], 3, version=1))
        writer.append(ITERATIONS, synthetic(ITERATIONS, [iteration], version=1))
        writer.compact()
    assert len(table_parts(run.run_dir, EVENTS)) <= 2  # 9 parts appended: 8 + 1
    expected = synthetic(EVENTS, range(8), 3, version=1)
    assert_same_rows(load_run(run.run_dir).events, expected)
    for path in table_parts(run.run_dir, EVENTS):  # every merged part holds only the latest rows
        data = pq.read_table(path).to_pandas()
        assert not data.duplicated(["iteration", "seq"]).any()
        assert data.iteration.is_monotonic_increasing


def test_reopened_writer_continues(tmp_path):
    policy = CompactionPolicy(fan_in=3)
    run = LongRun(tmp_path / "run", policy)
    for flush in range(40):
        run.flush([flush], [flush] if flush % 3 == 0 else [])
    run.writer = TraceWriter(run.run_dir, policy)  # a takeover opens a new writer on the directory
    assert [p.name for p in table_parts(run.run_dir, ITERATIONS)] == [p.name for p in run.writer.parts(ITERATIONS)]
    for flush in range(40, 100):
        run.flush([flush], [flush] if flush % 3 == 0 else [])
    names = [p.name for p in table_parts(run.run_dir, ITERATIONS)]
    assert len(names) == digit_sum(100, 3) and parse_part_name(names[-1])[1] == 100
    trace = load_run(run.run_dir)
    for table in TABLES:
        assert_same_rows(trace.read(table), run.expected(table))


class _Killed(BaseException):
    """Stands for the process dying at that point of a merge."""


def _run_until_merge(run_dir: Path, killed_after_write: bool, monkeypatch) -> LongRun:
    """Seven flushes, then an eighth whose merge of events dies before or after its part is written."""
    run = LongRun(run_dir)
    for flush in range(7):
        run.flush([flush], [flush])
    original = memprof.trace.format.compaction.write_atomically

    def write(path, data, **kwargs):
        if path.parent.name == "events.parquet" and not killed_after_write:
            raise _Killed
        original(path, data, **kwargs)
        if path.parent.name == "events.parquet":
            raise _Killed

    monkeypatch.setattr(memprof.trace.format.compaction, "write_atomically", write)
    with pytest.raises(_Killed):
        run.flush([7], [7])
    monkeypatch.undo()
    return run


def _check_each_iteration_once(run: LongRun, iterations: int) -> None:
    trace = load_run(run.run_dir)
    assert trace.iterations.iteration.tolist() == list(range(iterations))
    for table in TABLES:
        assert_same_rows(trace.read(table), run.expected(table))
        assert_same_rows(trace.read(table, iterations=[3]), synthetic(table, [3], rows_per_iteration(table)))


@pytest.mark.parametrize("killed_after_write", [False, True])
@pytest.mark.parametrize("inputs_left", [8, 3, 0])
def test_a_merge_killed_at_any_point_loses_and_repeats_nothing(tmp_path, monkeypatch, killed_after_write,
                                                              inputs_left):
    run = _run_until_merge(tmp_path / "run", killed_after_write, monkeypatch)
    events = run.run_dir / "events.parquet"
    names = sorted(p.name for p in events.glob("part-*.parquet"))
    if killed_after_write:
        assert names[-1] == part_name(1, 8, 1) and len(names) == 9  # merged part beside all its inputs
        for path in sorted(events.glob("part-*.parquet"))[: 8 - inputs_left]:
            path.unlink()  # the merge had deleted some of its inputs when it died
    else:
        assert len(names) == 8  # nothing merged yet
    (events / ".part-000009.parquet.0123abcd.tmp").write_bytes(b"half a merged part")
    _check_each_iteration_once(run, 8)
    # the reader sees every row once even when reading one column without the iteration
    assert load_run(run.run_dir).read(ITERATIONS, columns=["step_ms"]).step_ms.tolist() == \
        synthetic(ITERATIONS, range(8)).column("step_ms").to_pylist()
    # a new writer clears the leftovers and goes on
    run.writer = TraceWriter(run.run_dir)
    assert not list(events.glob(".*.tmp"))
    assert len(list(events.glob("part-*.parquet"))) == (1 if killed_after_write else 8)
    for flush in range(8, 20):
        run.flush([flush], [flush])
    _check_each_iteration_once(run, 20)
    assert len(table_parts(run.run_dir, EVENTS)) == digit_sum(20, 8)


def test_a_reader_opened_before_a_merge_reads_the_same_after_it(tmp_path):
    run = LongRun(tmp_path / "run")
    for flush in range(7):
        run.flush([2 * flush, 2 * flush + 1], [2 * flush])
    trace = load_run(run.run_dir)
    before = {table: list(trace._parts[table]) for table in TABLES}
    run.flush([14, 15], [14])  # the eighth flush merges the seven parts it listed away
    assert all(not p.exists() for table in TABLES for p in before[table])
    assert trace.iterations.iteration.tolist() == list(range(14))  # the snapshot it took, no more
    assert_same_rows(trace.read(EVENTS, iterations=[4]), synthetic(EVENTS, [4], 3))
    assert_same_rows(trace.layers, synthetic(LAYERS, range(0, 14, 2), 2))
    assert load_run(run.run_dir).iterations.iteration.tolist() == list(range(16))


def test_a_part_vanishing_while_the_reader_lists_them(tmp_path, monkeypatch):
    run = LongRun(tmp_path / "run")
    for flush in range(7):
        run.flush([flush], [flush])
    stale = table_parts(run.run_dir, ITERATIONS)
    run.flush([7], [7])  # merged away: the listing below is stale once
    calls = []

    def listing(run_dir, table):
        calls.append(table)
        return stale if calls.count(table) == 1 and table == ITERATIONS else table_parts(run_dir, table)

    monkeypatch.setattr(memprof.trace.parts, "table_parts", listing)
    trace = load_run(run.run_dir)
    assert calls.count(ITERATIONS) == 2
    assert trace.iterations.iteration.tolist() == list(range(8))


def test_a_damaged_part_stops_merges_with_one_warning(tmp_path):
    run = LongRun(tmp_path / "run")
    for flush in range(7):
        run.flush([flush], [])
    part = table_parts(run.run_dir, ITERATIONS)[3]
    data = bytearray(part.read_bytes())
    data[4] ^= 0xFF  # the first page header: the part can no longer be read
    part.write_bytes(bytes(data))
    run.writer = TraceWriter(run.run_dir)  # a writer that must read the part to merge it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for flush in range(7, 10):
            run.flush([flush], [])
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "could not merge" in messages[0] and "iterations.parquet" in messages[0]
    assert len(table_parts(run.run_dir, ITERATIONS)) == 10  # every part as it was


def test_only_merges_of_parts_that_may_be_on_disk_are_fsynced(tmp_path, monkeypatch):
    run = LongRun(tmp_path / "run", CompactionPolicy(fan_in=2))
    flags = []
    original = memprof.trace.format.compaction.write_atomically

    def write(path, data, *, durable=False):
        flags.append(durable)
        return original(path, data, durable=durable)

    monkeypatch.setattr(memprof.trace.format.compaction, "write_atomically", write)
    run.flush([0], [])
    run.flush([1], [])  # merges two parts written just now: a power loss would lose them anyway
    (merged,) = table_parts(run.run_dir, ITERATIONS)
    an_hour_ago = time.time() - 3600
    os.utime(merged, (an_hour_ago, an_hour_ago))  # long since written back to disk
    run.flush([2], [])
    run.flush([3], [])  # merges 2 and 3 (fresh), then both tier-1 parts (one old)
    assert flags == [False, False, True]
    assert load_run(run.run_dir).iterations.iteration.tolist() == [0, 1, 2, 3]


def test_policy_merges_only_same_tier_windows_within_the_caps():
    policy = CompactionPolicy(fan_in=2, max_rows=10, max_bytes=1000)

    def part(tier: int, rows: int | None = 1, size_bytes: int = 10) -> Part:
        return Part(Path("x"), 1, 1, tier, rows, size_bytes)

    assert policy.plan([part(0)]) is None
    assert policy.plan([part(1), part(0)]) is None
    assert policy.plan([part(1), part(0), part(0)]) == [part(0), part(0)]
    assert policy.plan([part(0, rows=6), part(0, rows=5)]) is None
    assert policy.plan([part(0, size_bytes=600), part(0, size_bytes=500)]) is None
    assert policy.plan([part(0, rows=None), part(0)]) is None
    assert policy.plan([part(9), part(9)]) is None
    with pytest.raises(ValueError, match="fan_in must be at least 2"):
        CompactionPolicy(fan_in=1)


def test_names_sort_in_write_order():
    # parts 1-8 merged into tier 1, its inputs still there (a killed merge), then 9-16 and 17
    names = [part_name(n, n, 0) for n in range(1, 9)] + [part_name(1, 8, 1)]
    names += [part_name(9, 16, 1), part_name(1, 16, 2), part_name(17, 17, 0), part_name(1, 64, 3)]
    assert sorted(names) == names
    assert [parse_part_name(n) for n in names[7:10]] == [(8, 8, 0), (1, 8, 1), (9, 16, 1)]
    assert parse_part_name("part-000001.parquet.tmp") is None and parse_part_name("part-x.parquet") is None


@st.composite
def flushes(draw) -> tuple[CompactionPolicy, list[tuple[list[int], list[int]]], int]:
    """A policy (small caps included), flushes of 0-6 iterations, some detailed, and when to reopen the writer."""
    policy = CompactionPolicy(fan_in=draw(st.integers(2, 4)), max_rows=draw(st.sampled_from([12, 40, 1 << 20])),
                              max_bytes=draw(st.sampled_from([30_000, 1 << 26])), row_group_rows=7)
    sizes = draw(st.lists(st.integers(0, 6), max_size=45))
    detail = draw(st.sampled_from([0.0, 0.3, 1.0]))
    picks = draw(st.lists(st.floats(0, 1), min_size=sum(sizes), max_size=sum(sizes)))
    result, first = [], 0
    for size in sizes:
        its = list(range(first, first + size))
        result.append((its, [i for i in its if picks[i] < detail]))
        first += size
    reopen_at = draw(st.integers(0, len(sizes)))
    return policy, result, reopen_at


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flushes())
def test_random_flushes_keep_every_row_and_stay_bounded(case):
    policy, batches, reopen_at = case
    with tempfile.TemporaryDirectory() as tmp:
        run = LongRun(Path(tmp) / "run", policy)
        for index, (its, detailed) in enumerate(batches):
            if index == reopen_at:
                run.writer = TraceWriter(run.run_dir, policy)
            run.flush(its, detailed)
            for table in TABLES:
                count, rows, size_bytes = table_size(run.run_dir, table)
                assert count <= bound(policy, run.parts[table], rows, size_bytes)
        trace = load_run(run.run_dir)
        for table in TABLES:
            assert_same_rows(trace.read(table), run.expected(table))
        if batches and batches[-1][0]:
            k = batches[-1][0][-1]
            assert trace.read(ITERATIONS, iterations=[k]).iteration.tolist() == [k]
        shutil.rmtree(run.run_dir)
