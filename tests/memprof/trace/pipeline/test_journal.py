"""The journal's files: segments of framed records, a torn tail, templates once per segment, the carried state
(the payloads' bytes: test_payloads.py)."""

from __future__ import annotations

import pytest

from memprof.analysis.records import CarriedState, LiveBlock
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.journal import (
    SEGMENT_RECORDS,
    JournalReader,
    JournalWriter,
    frames,
    read_state,
    segment_path,
    segment_starts,
    write_state,
)
from memprof.trace.pipeline.payloads import decode_record, encode_record, pack, payload_kind
from tests.memprof.trace.pipeline.records import record as _record
from tests.memprof.trace.pipeline.records import same as _same
from tests.memprof.trace.pipeline.records import same_template as _same_template
from tests.memprof.trace.pipeline.records import template_of as _template_of


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
    kinds = [payload_kind(payload) for payload in payloads]
    # the first segment: records 0-3, the first template before record 4, the second before record 40
    assert kinds.count("template") == 2 and kinds[4] == kinds[41] == "template"
    assert kinds.count("record") == SEGMENT_RECORDS
    plain = len(encode_record(replace(records[5], template=None)))
    steady = [len(p) for p, kind in zip(payloads, kinds) if kind == "record"][5]
    assert steady - plain < 64  # a steady record names its template: a few bytes of header, not its arrays
    second_segment = [payload_kind(p) for _, p in frames(segment_path(tmp_path, SEGMENT_RECORDS).read_bytes())]
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


def test_a_journal_of_an_older_memprof_is_refused_not_misread(tmp_path):
    import struct
    import zlib

    payload = pack({"kind": "record", "iteration": 0}, {}).replace(b"MPRJ\x04", b"MPRJ\x02", 1)
    old = struct.pack("<4sIQ", b"MPRF", zlib.adler32(payload), len(payload)) + payload
    segment_path(tmp_path, 0).write_bytes(old)
    with pytest.raises(CorruptTraceError, match="older memprof"):
        JournalReader(tmp_path, -1).next()
    with pytest.raises(CorruptTraceError, match=r"older memprof \(journal version 2\)"):
        decode_record(payload)
    version3 = pack({"kind": "record", "iteration": 0}, {}).replace(b"MPRJ\x04", b"MPRJ\x03", 1)
    segment_path(tmp_path, 0).write_bytes(struct.pack("<4sIQ", b"MPF3", zlib.crc32(version3), len(version3))
                                          + version3)
    with pytest.raises(CorruptTraceError, match=r"older memprof \(journal version 3\)"):
        JournalReader(tmp_path, -1).next()


