"""What the journal's frames and its state file hold, as bytes (:mod:`memprof.trace.pipeline.journal` writes
and reads them).

Two encodings, never pickles (a trace copied from someone else is data, and reading it must not run code):

- **an iteration's record**, written by ``record_stats()`` at every step: a fixed binary head (the record's
  numbers and the length of each table), then flat little-endian int64 words. It leaves out what its reader can
  rebuild exactly: the allocation sizes where they are its template's (a steady record's), the reserved bytes where
  they are all zero (a CPU's). Each step's record is encoded right after a training step, on caches the step
  emptied, where every numpy call costs several times what it does warm (a JSON head took 20-40 µs): so the head is
  one ``struct`` and nothing is worked out that saves less writing than it costs (the running totals, which on a
  CPU are the sizes' running sum, are written: checking that cost more than writing them).
- **a container** for the rest (a template, the carried state): a JSON head naming 1-D or 2-D int64 arrays, which
  follow.
"""

from __future__ import annotations

import json
import math
import struct
from array import array
from collections.abc import Mapping
from itertools import chain
from typing import Any, cast

import numpy as np

from memprof.analysis.records import AllocationEvents, IterationRecord, MarkRow, MarkTemplate
from memprof.analysis.template import same_allocations
from memprof.errors import CorruptTraceError

# Version 4: records in a binary head of their own. Version 3 had templates in frames of their own; version 2 set
# the category codes of observations and carried blocks to those with weight_copies and comm_buffers. Older
# journals are refused, not misread.
_MAGIC = b"MPRJ\x04\x00\x00\x00"
_OLD_MAGICS = (b"MPRJ\x01\x00\x00\x00", b"MPRJ\x02\x00\x00\x00", b"MPRJ\x03\x00\x00\x00")
_HEAD = struct.Struct("<8sQ")
_INT64 = np.dtype("<i8")

#: A buffer of a payload, written as it is (bytes, or the memory of a numpy array or an ``array('q')``).
Buffer = bytes | memoryview

# ---------------------------------------------------------------------------------------------- container


def pack_parts(header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> list[Buffer]:
    """Serialises a JSON header and named 1-D or 2-D int64 arrays, as buffers to write one after another."""
    shapes = {name: list(np.shape(a)) for name, a in arrays.items()}
    text = json.dumps({**header, "arrays": shapes}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keeps the arrays 8-byte aligned
    parts: list[Buffer] = [_HEAD.pack(_MAGIC, len(text)) + text]
    for value in arrays.values():
        column = _int64(value).reshape(-1)
        if column.size:
            parts.append(column.data)
    return parts


def pack(header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """:func:`pack_parts` as one byte string."""
    return _joined(pack_parts(header, arrays))


def unpack(data: bytes | memoryview, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`.

    Raises:
        CorruptTraceError: ``data`` is not a complete journal file (``what`` names it in the message).
    """
    _refuse_older(data, what)
    if len(data) < _HEAD.size or data[:8] != _MAGIC:
        raise CorruptTraceError(f"{what} is not a memprof journal file (expected the {_MAGIC[:4].decode()} "
                                f"version 4 header, found {bytes(data[:8])!r})")
    _, length = _HEAD.unpack_from(data)
    try:
        header = json.loads(bytes(data[_HEAD.size:_HEAD.size + length]))
        shapes = header.pop("arrays")
        offset, arrays = _HEAD.size + length, {}
        for name, shape in shapes.items():
            count = math.prod(shape)  # (1 for a scalar's empty shape)
            arrays[name] = np.frombuffer(data, dtype="<i8", count=count, offset=offset).reshape(shape)
            offset += 8 * count
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptTraceError(f"{what} is damaged ({exc}); it cannot be read") from None
    if offset != len(data):
        raise CorruptTraceError(f"{what} holds {len(data)} bytes where its header describes {offset}")
    return header, arrays


def _refuse_older(data: bytes | memoryview, what: str) -> None:
    if bytes(data[:8]) in _OLD_MAGICS:
        raise CorruptTraceError(f"{what} was written by an older memprof (journal version {data[4]}), which this one "
                                "does not read; the iterations its worker had written are readable, profile the run "
                                "again for the others")


def _joined(parts: list[Buffer]) -> bytes:
    return b"".join(bytes(memoryview(part)) for part in parts)  # (the raw bytes, whatever the item type)


def _int64(column: Any) -> np.ndarray:
    if type(column) is np.ndarray and column.dtype == _INT64 and column.flags.c_contiguous:
        return column  # (most are: no copy, no call)
    return np.ascontiguousarray(column, dtype=_INT64)


# ---------------------------------------------------------------------------------------------- records
_RECORD_MAGIC = b"MPRR\x04\x00\x00\x00"  # (versions 1-3 held records in the container)
# iteration, epoch, start_ns, end_ns, reserved_bytes, peak_reserved_bytes, template (-1: none), flags,
# then the rows of: events, marks, mark storages, observations, frees, param_grads, grads
_RECORD = struct.Struct("<8s15q")
_FAILED, _DETAIL, _SIZES, _RESERVED = 1, 2, 4, 8
_WIDTHS = (4, 2, 4, 2, 3, 3)  # words per row of the tables after the events


def encode_record(record: IterationRecord) -> bytes:
    """Serialises one iteration's record (see :func:`decode_record`); a steady one names its template, which the
    journal writes in a frame of its own (:func:`encode_template_parts`)."""
    return _joined(encode_record_parts(record))


def encode_record_parts(record: IterationRecord) -> list[Buffer]:
    """:func:`encode_record` as buffers to write one after another (no joined copy)."""
    ev, template = record.events, record.template
    flags = _FAILED * record.failed | _DETAIL * record.detail
    size = _int64(ev.size_bytes)
    columns = [_int64(ev.time_ns), _int64(ev.ptr), _int64(ev.total_allocated_bytes)]
    if template is None or not same_allocations(template, ev):  # (steady.py does next, on warm caches)
        flags |= _SIZES
        columns.append(size)
    if ev.total_reserved_bytes.any():
        flags |= _RESERVED
        columns.append(_int64(ev.total_reserved_bytes))
    small, counts = _small_tables(record)
    head = _RECORD.pack(_RECORD_MAGIC, record.iteration, record.epoch, record.start_ns, record.end_ns,
                        record.reserved_bytes, record.peak_reserved_bytes,
                        -1 if template is None else template.iteration, flags, len(size), *counts)
    return [head, *(column.data for column in columns if len(column)), memoryview(small)]


def _small_tables(record: IterationRecord) -> tuple[array, tuple[int, ...]]:
    """The tables after the events, as one run of int64 words, and each one's rows."""
    words = array("q")
    storages = 0
    for time_ns, kind, module, found in record.marks:
        words.extend((time_ns, kind, module, len(found)))
        storages += len(found)
    words.extend(chain.from_iterable(chain.from_iterable(m[3] for m in record.marks)))
    words.extend(chain.from_iterable(record.observations))
    words.extend(chain.from_iterable(record.frees))
    for table in (record.param_grads, record.grads):
        words.extend(chain.from_iterable((i, ptr, nbytes) for i, (ptr, nbytes) in table.items()))
    return words, (len(record.marks), storages, len(record.observations), len(record.frees),
                   len(record.param_grads), len(record.grads))


def decode_record(data: bytes | memoryview, what: str = "a journal record",
                  templates: Mapping[int, MarkTemplate] | None = None) -> IterationRecord:
    """Rebuilds an :class:`IterationRecord` from :func:`encode_record`'s bytes.

    Args:
        data: the record's payload.
        what: names it in errors.
        templates: the templates read before it, by iteration, for a steady record.

    Raises:
        CorruptTraceError: the bytes are not such a record.
    """
    record = decode_payload(data, what, dict(templates or {}))
    if record is None:
        raise CorruptTraceError(f"{what} is a template, not an iteration's record")
    return record


def decode_payload(data: bytes | memoryview, what: str,
                   templates: dict[int, MarkTemplate]) -> IterationRecord | None:
    """A journal frame's payload: its record, or ``None`` for a template, which joins ``templates``.

    Raises:
        CorruptTraceError: the bytes are neither.
    """
    if bytes(data[:8]) == _RECORD_MAGIC:
        return _decode_record(data, what, templates)
    header, arrays = unpack(data, what)
    if header.get("kind") != "template":
        raise CorruptTraceError(f"{what} is neither an iteration's record nor a template (kind "
                                f"{header.get('kind')!r})")
    try:
        template = _template_from(int(header["iteration"]), arrays)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptTraceError(f"{what} is damaged ({exc!r}); it cannot be read") from None
    templates[template.iteration] = template
    return None


def payload_kind(data: bytes | memoryview) -> str:
    """``"record"`` or ``"template"``: what a journal frame's payload holds (by its magic alone)."""
    return "record" if bytes(data[:8]) == _RECORD_MAGIC else "template"


def _decode_record(data: bytes | memoryview, what: str, templates: Mapping[int, MarkTemplate]) -> IterationRecord:
    if len(data) < _RECORD.size:
        raise CorruptTraceError(f"{what} holds {len(data)} bytes, fewer than a record's head")
    (_, iteration, epoch, start_ns, end_ns, reserved, peak_reserved, template_at, flags, n,
     *counts) = _RECORD.unpack_from(data)
    template = None
    if template_at >= 0:
        template = templates.get(template_at)
        if template is None:
            raise CorruptTraceError(f"{what} is damaged (it names the template of iteration {template_at}, which "
                                    "no frame before it holds); it cannot be read")
    columns = 3 + bool(flags & _SIZES) + bool(flags & _RESERVED)
    small = sum(width * count for width, count in zip(_WIDTHS, counts))
    if min(n, *counts) < 0 or len(data) != _RECORD.size + 8 * (columns * n + small):
        raise CorruptTraceError(f"{what} holds {len(data)} bytes where its head describes "
                                f"{_RECORD.size + 8 * (columns * max(n, 0) + small)}")
    words = np.frombuffer(data, dtype=_INT64, offset=_RECORD.size)
    taken = [words[k * n:(k + 1) * n] for k in range(columns)]
    time_ns, ptr, total, rest = taken[0], taken[1], taken[2], iter(taken[3:])
    size = next(rest) if flags & _SIZES else _template_sizes(template, n, what)
    reserved_column = next(rest) if flags & _RESERVED else np.zeros(n, dtype=np.int64)
    marks, storages, observations, frees, param_grads, grads = _split(words[columns * n:], counts)
    at, rows = 0, cast(list[MarkRow], [])
    for time_mark, kind, module, count in marks:
        rows.append((time_mark, kind, module, [(ptr, nbytes) for ptr, nbytes in storages[at:at + count]]))
        at += count
    return IterationRecord(
        iteration=iteration, epoch=epoch, start_ns=start_ns, end_ns=end_ns,
        events=AllocationEvents(time_ns, ptr, size, total, reserved_column), marks=rows,
        observations=[(t, ptr, code, nbytes) for t, ptr, code, nbytes in observations],
        frees=[(t, ptr) for t, ptr in frees],
        param_grads={i: (p, b) for i, p, b in param_grads}, grads={i: (p, b) for i, p, b in grads},
        reserved_bytes=reserved, peak_reserved_bytes=peak_reserved, failed=bool(flags & _FAILED),
        detail=bool(flags & _DETAIL), template=template)


def _template_sizes(template: MarkTemplate | None, n: int, what: str) -> np.ndarray:
    if template is None or len(template.sizes) != n:
        raise CorruptTraceError(f"{what} is damaged (its sizes are its template's, and its template has "
                                f"{'none' if template is None else len(template.sizes)} for {n} events)")
    return template.sizes


def _split(words: np.ndarray, counts: list[int]) -> list[list[list[int]]]:
    """The tables after the events, as lists of rows."""
    tables, at = [], 0
    for width, count in zip(_WIDTHS, counts):
        tables.append(words[at:at + width * count].reshape(count, width).tolist())
        at += width * count
    return tables


# ---------------------------------------------------------------------------------------------- templates
def encode_template_parts(template: MarkTemplate) -> list[Buffer]:
    """A template's own payload (see :func:`decode_payload`): its arrays, written as they are."""
    return pack_parts({"kind": "template", "iteration": template.iteration}, {
        "template_sizes": template.sizes, "template_pairing": template.pairing,
        "template_marks": template.marks, "template_storages": template.storages,
        "template_observations": template.observations, "template_param_grads": template.param_grads})


def _template_from(iteration: int, arrays: dict[str, np.ndarray]) -> MarkTemplate:
    marks, storages = arrays["template_marks"].reshape(-1, 4), arrays["template_storages"].reshape(-1, 3)
    if int(marks[:, 3].sum()) != len(storages):
        raise ValueError(f"the template's marks name {int(marks[:, 3].sum())} storages, {len(storages)} follow")
    return MarkTemplate(iteration=iteration, sizes=arrays["template_sizes"],
                        pairing=arrays["template_pairing"], marks=marks, storages=storages,
                        observations=arrays["template_observations"].reshape(-1, 4),
                        param_grads=arrays["template_param_grads"].reshape(-1, 4))
