"""The journal's file format: records survive the round trip, a torn or foreign file is never misread."""

from __future__ import annotations

import numpy as np
import pytest

from memprof.analysis.records import AllocationEvents, CarriedState, IterationRecord, LiveBlock, Mark
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.journal import (
    SEGMENT_RECORDS,
    JournalReader,
    JournalWriter,
    decode_record,
    encode_record,
    frames,
    pack,
    read_state,
    segment_path,
    segment_starts,
    unpack,
    write_state,
)


def _record(iteration: int, n_events: int = 5) -> IterationRecord:
    rng = np.random.default_rng(iteration)
    events = AllocationEvents(*(rng.integers(0, 1 << 40, n_events) for _ in range(5)))
    return IterationRecord(
        iteration=iteration, epoch=iteration // 3, start_ns=1_000 + iteration, end_ns=2_000 + iteration,
        events=events,
        marks=[(10, Mark.FWD_ENTER, 0, [(0x1000, 64), (0x2000, 32)]), (11, Mark.FWD_EXIT, 0, []),
               (12, Mark.BWD_END, -1, [])],
        observations=[(10, 0x1000, 6, 64), (11, 0x3000, 3, 0)], frees=[(13, 0x1000)],
        param_grads={0: (0x4000, 16)}, grads={0: (0x4000, 16), 2: (0x5000, 8)},
        reserved_bytes=4096, peak_reserved_bytes=8192, failed=iteration == 7)


def _same(a: IterationRecord, b: IterationRecord) -> None:
    for name in ("time_ns", "ptr", "size_bytes", "total_allocated_bytes", "total_reserved_bytes"):
        np.testing.assert_array_equal(getattr(a.events, name), getattr(b.events, name))
    assert [(t, int(k), m, [tuple(s) for s in p]) for t, k, m, p in a.marks] == \
        [(t, int(k), m, [tuple(s) for s in p]) for t, k, m, p in b.marks]
    assert [tuple(o) for o in a.observations] == [tuple(o) for o in b.observations]
    assert [tuple(f) for f in a.frees] == [tuple(f) for f in b.frees]
    assert (a.param_grads, a.grads) == (b.param_grads, b.grads)
    assert (a.iteration, a.epoch, a.start_ns, a.end_ns, a.reserved_bytes, a.peak_reserved_bytes, a.failed) == \
        (b.iteration, b.epoch, b.start_ns, b.end_ns, b.reserved_bytes, b.peak_reserved_bytes, b.failed)


def _template_of(iteration: int):
    from dataclasses import replace

    from memprof.analysis.template import take_template

    hooked = _record(iteration, 6)
    template = take_template(replace(hooked, events=AllocationEvents(*(np.sort(c) for c in (
        hooked.events.time_ns, hooked.events.ptr, hooked.events.size_bytes, hooked.events.total_allocated_bytes,
        hooked.events.total_reserved_bytes)))))
    assert template is not None
    return template


def _same_template(a, b) -> None:
    assert a.iteration == b.iteration
    for name in ("sizes", "pairing", "marks", "storages", "observations", "param_grads"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("iteration,n_events", [(0, 0), (3, 5), (7, 1000)])
def test_record_round_trip(iteration, n_events):
    record = _record(iteration, n_events)
    _same(decode_record(encode_record(record)), record)


def test_a_steady_records_template_round_trips_and_a_damaged_one_is_refused():
    from dataclasses import replace

    template = _template_of(3)
    assert len(template.storages) == 2
    steady = replace(_record(4, 6), template=template)
    back = decode_record(encode_record(steady))
    _same(back, steady)
    _same_template(back.template, template)
    assert decode_record(encode_record(_record(3, 6))).template is None
    torn = replace(steady, template=replace(template, storages=template.storages[:1]))
    with pytest.raises(CorruptTraceError, match="damaged"):
        decode_record(encode_record(torn))


def test_empty_record_round_trip():
    record = IterationRecord(iteration=0, epoch=0, start_ns=1, end_ns=2, events=AllocationEvents.empty())
    _same(decode_record(encode_record(record)), record)


@pytest.mark.parametrize("key", ["node_rows", "watches"])  # a forward without backward left only watches
def test_a_record_with_native_backward_rows_is_refused(key):
    """A journal left by a memprof that took backward marks from its native reporter cannot be replayed."""
    record = _record(3)
    header, arrays = unpack(encode_record(record), "a record")
    arrays[key] = np.zeros((1, 5), dtype=np.int64)
    with pytest.raises(CorruptTraceError, match="older memprof"):
        decode_record(pack(header, arrays))


@pytest.mark.parametrize("data", [b"", b"PAR1" + b"\0" * 60, b'{"format": "x"}'])
def test_foreign_bytes_are_refused(data):
    with pytest.raises(CorruptTraceError, match="not a memprof journal file"):
        unpack(data, "a test file")


def test_truncated_record_is_refused():
    data = encode_record(_record(3))
    with pytest.raises(CorruptTraceError, match="holds .* bytes where its header describes|damaged"):
        decode_record(data[:-8])


def test_writer_and_reader_follow_segments(tmp_path):
    writer = JournalWriter(tmp_path)
    total = SEGMENT_RECORDS + 5
    for i in range(total):
        writer.append(_record(i))
    writer.close()
    assert segment_starts(tmp_path) == [0, SEGMENT_RECORDS]
    reader = JournalReader(tmp_path, last_iteration=-1)
    seen = []
    while (record := reader.next()) is not None:
        seen.append(record.iteration)
        if record.iteration == 5:
            _same(record, _record(5))
    assert seen == list(range(total))
    # a reader that starts later skips what was processed before
    later = JournalReader(tmp_path, last_iteration=SEGMENT_RECORDS - 3)
    assert later.next().iteration == SEGMENT_RECORDS - 2


def test_a_torn_or_damaged_tail_is_where_reading_stops(tmp_path):
    writer = JournalWriter(tmp_path)
    for i in range(3):
        writer.append(_record(i))
    writer.close()
    path = segment_path(tmp_path, 0)
    data = path.read_bytes()
    assert len(list(frames(data))) == 3
    torn = data[:-10]  # the writer was killed inside the last write
    assert len(list(frames(torn))) == 2
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF  # a damaged byte in the last record: its checksum no longer matches
    assert len(list(frames(bytes(flipped)))) == 2
    path.write_bytes(torn)
    reader = JournalReader(tmp_path, -1)
    assert [reader.next().iteration for _ in range(2)] == [0, 1]
    assert reader.next() is None  # not an error: the rest may still be coming


def test_a_gap_in_the_journal_is_an_error(tmp_path):
    writer = JournalWriter(tmp_path)
    writer.append(_record(0))
    writer.append(_record(2))
    writer.close()
    reader = JournalReader(tmp_path, -1)
    assert reader.next().iteration == 0
    with pytest.raises(CorruptTraceError, match="holds iteration 2 where 1 was expected"):
        reader.next()


def test_state_round_trip_and_drops_finished_segments(tmp_path):
    writer = JournalWriter(tmp_path)
    for i in range(SEGMENT_RECORDS + 1):
        writer.append(_record(i))
    writer.close()
    state = CarriedState(SEGMENT_RECORDS - 1, [LiveBlock(-1, 0x10, 64, 0), LiveBlock(7, 0x20, 8, 4)], 8, {0: 0, 3: 1})
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    assert segment_starts(tmp_path) == [SEGMENT_RECORDS]  # every iteration of the first is final


def _reference_parts(record: IterationRecord) -> bytes:
    """The record's bytes by the plain, slower numpy calls the encoder once made (the format's definition)."""
    marks = record.marks
    head = np.array([[t, int(k), m, len(p)] for t, k, m, p in marks], dtype=np.int64).reshape(-1, 4)
    storages = np.array([s for *_, p in marks for s in p], dtype=np.int64).reshape(-1, 2)
    ev = record.events
    arrays = {
        "events": np.stack([ev.time_ns, ev.ptr, ev.size_bytes, ev.total_allocated_bytes, ev.total_reserved_bytes]),
        "marks": head, "mark_storages": storages,
        "observations": np.array(record.observations, dtype=np.int64).reshape(-1, 4),
        "frees": np.array(record.frees, dtype=np.int64).reshape(-1, 2),
        "param_grads": np.array([(i, *s) for i, s in record.param_grads.items()], dtype=np.int64).reshape(-1, 3),
        "grads": np.array([(i, *s) for i, s in record.grads.items()], dtype=np.int64).reshape(-1, 3),
    }
    header = {"kind": "record", "iteration": record.iteration, "epoch": record.epoch, "start_ns": record.start_ns,
              "end_ns": record.end_ns, "reserved_bytes": record.reserved_bytes,
              "peak_reserved_bytes": record.peak_reserved_bytes, "failed": record.failed, "detail": record.detail}
    return pack(header, {name: np.asfortranarray(a) for name, a in arrays.items()})  # (any layout packs alike)


@pytest.mark.parametrize("iteration,n_events", [(0, 0), (3, 5), (7, 1000)])
def test_record_bytes_are_the_plain_encodings(iteration, n_events):
    record = _record(iteration, n_events)
    assert encode_record(record) == _reference_parts(record)
    empty = IterationRecord(iteration=0, epoch=0, start_ns=1, end_ns=2, events=AllocationEvents.empty())
    assert encode_record(empty) == _reference_parts(empty)


def test_a_template_is_written_once_per_segment_and_every_segment_reads_alone(tmp_path):
    from dataclasses import replace

    first, second = _template_of(3), _template_of(40)
    records = [replace(_record(i), template=None if i < 4 else first if i < 40 else second)
               for i in range(SEGMENT_RECORDS + 8)]
    writer = JournalWriter(tmp_path)
    for record in records:
        writer.append(record)
    writer.close()
    payloads = [bytes(payload) for _, payload in frames(segment_path(tmp_path, 0).read_bytes())]
    kinds = [unpack(payload, "a frame")[0]["kind"] for payload in payloads]
    # the first segment: records 0-3, the first template before record 4, the second before record 40
    assert kinds.count("template") == 2 and kinds[4] == kinds[41] == "template"
    assert kinds.count("record") == SEGMENT_RECORDS
    plain = len(encode_record(replace(records[5], template=None)))
    steady = [len(p) for p, kind in zip(payloads, kinds) if kind == "record"][5]
    assert steady - plain < 64  # a steady record names its template: a few bytes of header, not its arrays
    second_segment = [unpack(bytes(p), "a frame")[0]["kind"]
                      for _, p in frames(segment_path(tmp_path, SEGMENT_RECORDS).read_bytes())]
    assert second_segment == ["template"] + ["record"] * 8  # the second template again, for this segment alone
    segment_path(tmp_path, 0).unlink()  # processed and removed: the second segment is read without it
    reader = JournalReader(tmp_path, last_iteration=SEGMENT_RECORDS - 1)
    seen = []
    while (record := reader.next()) is not None:
        seen.append(record)
        _same(record, records[record.iteration])
        _same_template(record.template, second)
    assert [r.iteration for r in seen] == list(range(SEGMENT_RECORDS, SEGMENT_RECORDS + 8))
    assert len({id(r.template) for r in seen}) == 1  # decoded once, shared by its records
    whole = JournalWriter(tmp_path / "again")
    (tmp_path / "again").mkdir()
    for record in records[:45]:
        whole.append(record)
    whole.close()
    reader = JournalReader(tmp_path / "again", last_iteration=-1)
    for i in range(45):
        back = reader.next()
        assert back.iteration == i
        if records[i].template is None:
            assert back.template is None
        else:
            _same_template(back.template, records[i].template)


def test_a_record_whose_template_is_missing_is_refused():
    from dataclasses import replace

    from memprof.trace.pipeline.journal import encode_record_parts

    steady = replace(_record(5), template=_template_of(3))
    payload = b"".join(encode_record_parts(steady, template_inline=False))
    with pytest.raises(CorruptTraceError, match="names the template of iteration 3, which no frame before it"):
        decode_record(payload)
    _same(decode_record(payload, templates={3: steady.template}), steady)


def test_a_journal_of_an_older_memprof_is_refused_not_misread(tmp_path):
    import struct
    import zlib

    payload = encode_record(_record(0)).replace(b"MPRJ\x03", b"MPRJ\x02", 1)
    old = struct.pack("<4sIQ", b"MPRF", zlib.adler32(payload), len(payload)) + payload
    segment_path(tmp_path, 0).write_bytes(old)
    with pytest.raises(CorruptTraceError, match="older memprof"):
        JournalReader(tmp_path, -1).next()
    with pytest.raises(CorruptTraceError, match=r"older memprof \(journal version 2\)"):
        decode_record(payload)


def test_a_template_read_as_a_record_is_refused():
    from memprof.trace.pipeline.journal import encode_template_parts

    payload = b"".join(encode_template_parts(_template_of(3)))
    with pytest.raises(CorruptTraceError, match="is a template, not an iteration's record"):
        decode_record(payload)
