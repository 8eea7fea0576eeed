"""DDP's bucket rebuild as the analysis sees it: a mark, stand-ins freed, the wrapper's new blocks as comm buffers.

Hand-made records (no torch): the DDP wrapper is the root (module 0) and wraps module 1. The buckets made before
profiling are carried at stand-in addresses; the rebuild frees them where the wrapper's forward began and
allocates the new ones before the wrapped module runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memprof.analysis.layers import comm_shares
from memprof.analysis.records import CAT, AllocationEvents, CarriedState, IterationRecord, LiveBlock, Mark
from memprof.analysis.sweep import sweep
from memprof.analysis.timeline import event_table, series
from memprof.categories import CATEGORY_COLUMNS, Category
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.journal import read_state, write_state
from memprof.trace.pipeline.payloads import decode_record, encode_record, pack

BUCKET, WEIGHTS = 1680, 1680
STANDIN = -(1 << 48)  # memprof.capture.distributed's first stand-in address
CARRIED = [LiveBlock(-1, 0x1000, WEIGHTS, CAT[Category.WEIGHTS]), LiveBlock(-2, STANDIN, BUCKET, CAT[Category.COMM_BUFFERS])]


def _events(rows: list[tuple[int, int, int]]) -> AllocationEvents:
    """``(time, ptr, size)`` rows (size < 0: a free); CPU totals are not used."""
    t, p, s = (np.array(c, dtype=np.int64) for c in zip(*rows))
    return AllocationEvents(t, p, s, np.zeros_like(t), np.zeros_like(t))


def _rebuild_iteration() -> tuple[AllocationEvents, list]:
    events = _events([
        (11, 0x5000, 4),  # a scalar DDP's _pre_forward makes before the rebuild and keeps (its logger's)
        (12, 0x2000, BUCKET),  # the new bucket
        (13, 0x3000, 40),  # a temporary there too (a buffer broadcast)
        (14, 0x3000, -40),
        (16, 0x4000, 64),  # the wrapped module's activation
    ])
    marks = [
        (10, Mark.FWD_ENTER, 0, []),
        # stamped with the wrapper's forward enter: the stand-in to free, and what the new buckets hold
        (10, Mark.BUCKETS_REBUILT, 0, [(STANDIN, BUCKET), (0, BUCKET)]),
        (15, Mark.FWD_ENTER, 1, []),
        (17, Mark.FWD_EXIT, 1, [(0x4000, 64)]),
        (18, Mark.FWD_EXIT, 0, [(0x4000, 64)]),
    ]
    return events, marks


def test_a_rebuild_frees_the_standins_first_and_its_new_blocks_are_comm_buffers() -> None:
    events, marks = _rebuild_iteration()
    sw = sweep(events, marks, [], [], CARRIED, [-1, 0], 1, use_truth=False)
    s = series(sw, use_truth=False)
    code = {c: CAT[c] for c in Category}
    category_of = {sw.block_ids[i]: sw.categories[i] for i in range(len(sw.sizes))}
    assert category_of[-2] == code[Category.COMM_BUFFERS]  # the stand-in, now freed
    by_size = {sw.sizes[i]: sw.categories[i] for i in range(len(sw.sizes)) if sw.alloc_change[i] >= 0}
    # the buckets are the largest blocks up to the bytes they hold; the scalar is what it was without a rebuild
    assert by_size == {BUCKET: code[Category.COMM_BUFFERS], 4: code[Category.FEATURE_MAPS], 40: code[Category.OTHER],
                       64: code[Category.FEATURE_MAPS]}
    comm = s.per_category[:, code[Category.COMM_BUFFERS]].tolist()
    # start, the stand-in's free, the scalar, the new bucket, the temporary, its free, the activation: never both
    # buckets at once
    assert comm == [BUCKET, 0, 0, BUCKET, BUCKET, BUCKET, BUCKET]
    held = WEIGHTS + BUCKET + 4
    assert s.total.tolist() == [WEIGHTS + BUCKET, WEIGHTS, WEIGHTS + 4, held, held + 40, held, held + 64]
    # the mark is no row of the timeline: the wrapper's and the module's enter and exit, start and end
    table = event_table(sw, s, 0, 0, 20, ["", "module"], 0)
    assert table.column("event").to_pylist() == ["start", "enter", "enter", "exit", "exit", "end"]
    rows = table.to_pydict()
    assert all(sum(rows[c][k] for c in CATEGORY_COLUMNS) == rows["allocated_bytes"][k] for k in range(6))


def test_without_the_buckets_size_every_block_the_rebuild_left_alive_is_one() -> None:
    events, marks = _rebuild_iteration()
    marks[1] = (10, Mark.BUCKETS_REBUILT, 0, [(STANDIN, BUCKET)])  # DDP's logging data gave no sizes
    sw = sweep(events, marks, [], [], CARRIED, [-1, 0], 1, use_truth=False)
    by_size = {sw.sizes[i]: sw.categories[i] for i in range(len(sw.sizes)) if sw.alloc_change[i] >= 0}
    assert by_size[BUCKET] == by_size[4] == CAT[Category.COMM_BUFFERS]


def test_without_a_rebuild_the_wrappers_blocks_are_what_they_were() -> None:
    events, marks = _rebuild_iteration()
    marks = [m for m in marks if m[1] != Mark.BUCKETS_REBUILT]
    sw = sweep(events, marks, [], [], CARRIED, [-1, 0], 1, use_truth=False)
    by_size = {sw.sizes[i]: sw.categories[i] for i in range(len(sw.sizes)) if sw.alloc_change[i] >= 0}
    assert by_size[BUCKET] == by_size[4] == CAT[Category.FEATURE_MAPS]  # alive when the forward returned, as before
    assert sw.live[STANDIN] >= 0  # the stand-in stays until a rebuild frees it


def test_the_mark_and_its_standins_survive_the_journal(tmp_path: Path) -> None:
    events, marks = _rebuild_iteration()
    record = IterationRecord(iteration=1, epoch=0, start_ns=0, end_ns=20, events=events, marks=marks)
    back = decode_record(encode_record(record))
    assert [(int(t), int(k), int(m), [tuple(map(int, s)) for s in p]) for t, k, m, p in back.marks] == [
        (t, int(k), m, [tuple(s) for s in p]) for t, k, m, p in marks]
    journal = tmp_path / ".journal"
    journal.mkdir()
    write_state(journal, CarriedState(0, CARRIED, 1))
    assert read_state(journal).blocks == CARRIED  # negative stand-in addresses included


def test_a_journal_with_the_old_category_codes_is_refused() -> None:
    # version 1 (records in the container, as until version 3): its codes numbered the categories before
    # weight_copies and comm_buffers existed
    data = bytearray(pack({"kind": "record", "iteration": 1}, {"observations": np.zeros((1, 4), dtype=np.int64)}))
    data[4] = 1
    with pytest.raises(CorruptTraceError, match="older memprof"):
        decode_record(bytes(data))


def test_the_console_report_lists_comm_buffers_and_weight_copies_when_they_hold_bytes() -> None:
    from memprof.analysis.console import format_report

    row = {"iteration": 1, "epoch": 0, "step_ms": 1.0, "peak_allocated_bytes": 4096, "allocated_bytes": 2048,
           "peak_phase": "forward", "peak_module": "", **dict.fromkeys(CATEGORY_COLUMNS, 0),
           "weights": WEIGHTS, "comm_buffers": BUCKET}
    lines = format_report(row, [], "cpu").splitlines()
    assert any(line.split()[:3] == ["comm_buffers", "1.6", "KiB"] for line in lines)
    assert not any("weight_copies" in line for line in lines)  # none in this run: no row
    assert any(line.split()[:1] == ["grads"] for line in lines)  # the usual categories always have theirs


def test_each_layer_holds_the_bucket_slots_of_its_gradients() -> None:
    # root, two Linears and a ReLU: gradients 1,152 + 528 B; the bucket holds as many bytes
    assert comm_shares(1680, [1680, 1152, 528, 0], [1680, 1152, 528, 0]) == [1680, 1152, 528, 0]
    # gradients set to None before the record: shared by parameters instead
    assert comm_shares(840, [0, 0, 0, 0], [1680, 1152, 528, 0]) == [840, 576, 264, 0]
    assert comm_shares(0, [1680, 1152, 528, 0], [1680, 1152, 528, 0]) == [0, 0, 0, 0]  # no DDP
