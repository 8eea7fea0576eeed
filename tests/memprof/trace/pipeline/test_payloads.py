"""The journal's payloads: records and templates survive the round trip, a steady record leaves out only what its
reader rebuilds exactly, a torn, foreign or older payload is refused, never misread."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from memprof.analysis.records import AllocationEvents, IterationRecord
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.payloads import (
    decode_payload,
    decode_record,
    encode_record,
    encode_template_parts,
    pack,
    payload_kind,
    unpack,
)
from tests.memprof.trace.pipeline.records import record, same, same_template, template_of


def _plain_encoding(rec: IterationRecord, columns: list[np.ndarray], flags: int) -> bytes:
    """A record's bytes built by plain numpy and struct calls, one table at a time (the format's definition)."""
    marks = np.array([[t, int(k), m, len(p)] for t, k, m, p in rec.marks], dtype=np.int64).reshape(-1, 4)
    storages = np.array([s for *_, p in rec.marks for s in p], dtype=np.int64).reshape(-1, 2)
    tables = [marks, storages, np.array(rec.observations, dtype=np.int64).reshape(-1, 4),
              np.array(rec.frees, dtype=np.int64).reshape(-1, 2),
              np.array([(i, *s) for i, s in rec.param_grads.items()], dtype=np.int64).reshape(-1, 3),
              np.array([(i, *s) for i, s in rec.grads.items()], dtype=np.int64).reshape(-1, 3)]
    template = -1 if rec.template is None else rec.template.iteration
    head = struct.pack("<8s15q", b"MPRR\x04\x00\x00\x00", rec.iteration, rec.epoch, rec.start_ns, rec.end_ns,
                       rec.reserved_bytes, rec.peak_reserved_bytes, template, flags, len(rec.events),
                       *(len(t) for t in tables))
    return head + b"".join(np.asarray(c, dtype="<i8").tobytes() for c in columns) + \
        b"".join(t.astype("<i8").tobytes() for t in tables)


@pytest.mark.parametrize("iteration,n_events", [(0, 0), (3, 5), (7, 1000)])
def test_record_round_trip(iteration, n_events):
    rec = record(iteration, n_events)
    same(decode_record(encode_record(rec)), rec)
    same(decode_record(encode_record(replace(rec, detail=True))), replace(rec, detail=True))


@pytest.mark.parametrize("iteration,n_events", [(0, 0), (3, 5), (7, 1000)])
def test_record_bytes_are_the_plain_encoding(iteration, n_events):
    rec = record(iteration, n_events)
    ev = rec.events
    everything = [ev.time_ns, ev.ptr, ev.total_allocated_bytes, ev.size_bytes, ev.total_reserved_bytes]
    flags = (1 if rec.failed else 0) | 4 | (8 if n_events else 0)  # (sizes: no template to take them from)
    assert encode_record(rec) == _plain_encoding(rec, everything if n_events else [], flags)


def _steady(iteration: int, template_iteration: int = 3) -> IterationRecord:
    """A steady record as the CPU reports it: its template's sizes, no reserved bytes."""
    template = template_of(template_iteration)
    sizes = np.asarray(template.sizes)
    times = np.arange(len(sizes), dtype=np.int64) + 10_000
    totals = (1 << 20) + np.cumsum(sizes)
    events = AllocationEvents(times, np.arange(len(sizes), dtype=np.int64) * 64 + 0x7000, sizes.copy(), totals,
                              np.zeros(len(sizes), dtype=np.int64))
    return replace(record(iteration, len(sizes)), events=events, template=template, failed=False)


def test_a_steady_record_leaves_out_its_templates_sizes_and_zero_reserved_bytes():
    steady = _steady(4)
    data = encode_record(steady)
    ev = steady.events
    assert data == _plain_encoding(steady, [ev.time_ns, ev.ptr, ev.total_allocated_bytes], 0)
    back = decode_record(data, templates={3: steady.template})
    same(back, steady)
    same_template(back.template, steady.template)
    # any column that differs from what the reader would rebuild is written
    for column, bit in (("size_bytes", 4), ("total_reserved_bytes", 8)):
        values = getattr(steady.events, column).copy()
        values[-1] += 8
        changed = replace(steady, events=replace(steady.events, **{column: values}))
        flags = int(struct.unpack_from("<8s15q", encode_record(changed))[8])
        assert flags & (4 | 8) == bit
        same(decode_record(encode_record(changed), templates={3: steady.template}), changed)


def test_empty_record_round_trip():
    rec = IterationRecord(iteration=0, epoch=0, start_ns=1, end_ns=2, events=AllocationEvents.empty())
    same(decode_record(encode_record(rec)), rec)


def test_templates_round_trip_and_a_damaged_one_is_refused():
    template = template_of(3)
    payload = b"".join(bytes(p) for p in encode_template_parts(template))
    assert payload_kind(payload) == "template" and payload_kind(encode_record(record(3))) == "record"
    found: dict = {}
    assert decode_payload(payload, "a frame", found) is None
    same_template(found[3], template)
    torn = replace(template, storages=template.storages[:1])
    with pytest.raises(CorruptTraceError, match="damaged"):
        decode_payload(b"".join(bytes(p) for p in encode_template_parts(torn)), "a frame", {})
    with pytest.raises(CorruptTraceError, match="is a template, not an iteration's record"):
        decode_record(payload)


def test_a_record_whose_template_is_missing_is_refused():
    steady = replace(record(5), template=template_of(3))
    payload = encode_record(steady)
    with pytest.raises(CorruptTraceError, match="names the template of iteration 3, which no frame before it"):
        decode_record(payload)
    same(decode_record(payload, templates={3: steady.template}), steady)


@pytest.mark.parametrize("data", [b"", b"PAR1" + b"\0" * 60, b'{"format": "x"}'])
def test_foreign_bytes_are_refused(data):
    with pytest.raises(CorruptTraceError, match="not a memprof journal file"):
        unpack(data, "a test file")
    with pytest.raises(CorruptTraceError, match="not a memprof journal file"):
        decode_record(data)


@pytest.mark.parametrize("cut", [8, 1, 200])
def test_a_truncated_record_is_refused(cut):
    data = encode_record(record(3, 40))
    with pytest.raises(CorruptTraceError, match="holds .* bytes"):
        decode_record(data[:-cut])


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_payload_of_an_older_memprof_is_refused_with_its_version(version):
    old = pack({"kind": "record", "iteration": 0}, {}).replace(b"MPRJ\x04", b"MPRJ" + bytes([version]), 1)
    with pytest.raises(CorruptTraceError, match=rf"older memprof \(journal version {version}\)"):
        decode_record(old)


def test_the_container_round_trips_arrays_of_any_layout():
    arrays = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.asfortranarray(np.ones((3, 2), np.int64)),
              "none": np.zeros((0, 4), dtype=np.int64)}
    header, back = unpack(pack({"kind": "x", "n": 1}, arrays), "a container")
    assert header == {"kind": "x", "n": 1}
    for name in ("a", "b", "none"):
        np.testing.assert_array_equal(back[name], arrays[name])
