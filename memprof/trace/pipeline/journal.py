"""The journal: raw iteration records on disk, between the training process and the worker.

``record_stats()`` only appends what it saw (:class:`~memprof.analysis.records.IterationRecord`) to a
segment file under ``<run>/.journal/`` (``seg-<first iteration>.log``, :data:`SEGMENT_RECORDS` records
each), one ``writev`` per record. A record is a frame: magic, CRC-32 and length, then the payload; a reader
stops at the first incomplete or damaged frame, which is what a killed writer leaves. A steady iteration's
record names its template (:class:`~memprof.analysis.records.MarkTemplate`, half a steady record's bytes),
which a frame of its own holds once per segment, before the first record that names it: every segment can
be read alone, and the records in between carry only their own events.
The background worker (:mod:`memprof.trace.pipeline.worker`) turns the records into Parquet parts and writes its
carried state (``state.bin``, atomically) after each batch; a segment is deleted once every iteration
in it is in the tables. ``spec.json`` (the run's :class:`~memprof.analysis.records.RunSpec`) is also
written atomically. Should both processes die, the reader finishes the remaining records in memory
(:mod:`memprof.trace.pipeline.recovery`).

Payloads are flat little-endian int64 arrays after a JSON header, never pickles: a trace copied from
someone else is data, and reading it must not run code.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from memprof.analysis.records import (
    AllocationEvents,
    BlockTable,
    CarriedState,
    IterationRecord,
    MarkTemplate,
    RunSpec,
    block_table,
)
from memprof.atomic import write_atomically
from memprof.errors import CorruptTraceError

JOURNAL_DIR = ".journal"
SPEC_FILE = "spec.json"
STATE_FILE = "state.bin"
# Version 3: templates in frames of their own, frames checked by CRC-32. Version 2 set the category codes of
# observations and carried blocks to those with weight_copies and comm_buffers. Older journals are refused,
# not misread.
_MAGIC = b"MPRJ\x03\x00\x00\x00"
_OLD_MAGICS = (b"MPRJ\x01\x00\x00\x00", b"MPRJ\x02\x00\x00\x00")
_HEAD = struct.Struct("<8sQ")
_SEGMENT_SUFFIX = ".log"
#: Records per segment file; the worker deletes a segment once all its iterations are in the tables.
SEGMENT_RECORDS = 64
_FRAME = struct.Struct("<4sIQ")  # magic, CRC-32 of the payload, payload length
_FRAME_MAGIC = b"MPF3"
_OLD_FRAME_MAGIC = b"MPRF"  # versions 1 and 2 (Adler-32)
_INT64 = np.dtype("<i8")


def segment_path(journal_dir: Path, iteration: int) -> Path:
    """The segment file that holds the record of ``iteration``."""
    first = iteration - iteration % SEGMENT_RECORDS
    return journal_dir / f"seg-{first:09d}{_SEGMENT_SUFFIX}"


def segment_starts(journal_dir: Path) -> list[int]:
    """First iteration of every segment in ``journal_dir``, in order."""
    found = []
    for path in journal_dir.glob(f"seg-*{_SEGMENT_SUFFIX}"):
        digits = path.name[4:-len(_SEGMENT_SUFFIX)]
        if digits.isdigit():
            found.append(int(digits))
    return sorted(found)


# ---------------------------------------------------------------------------------------------- container
def pack_parts(header: dict[str, Any], arrays: Mapping[str, np.ndarray | tuple[np.ndarray, ...]]) -> list[bytes | memoryview]:
    """Serialises a JSON header and named 1-D or 2-D int64 arrays, as buffers to write one after another.

    A 2-D array may come as a tuple of its rows (equal-length 1-D arrays): written as the array would be, with no
    copy into one (a record's allocator events, five columns of ~1,500 values each).
    """
    shapes = {name: [len(a), len(a[0]) if a else 0] if isinstance(a, tuple) else list(np.shape(a))
              for name, a in arrays.items()}
    text = json.dumps({**header, "arrays": shapes}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keeps the arrays 8-byte aligned
    parts: list[bytes | memoryview] = [_HEAD.pack(_MAGIC, len(text)) + text]
    for value in arrays.values():
        for array in value if isinstance(value, tuple) else (value,):
            if not (type(array) is np.ndarray and array.ndim and array.dtype == _INT64 and array.flags.c_contiguous):
                array = np.ascontiguousarray(array, dtype="<i8").reshape(-1)  # (most are already: no copy, no call)
            if array.size:  # (a memoryview of an empty array cannot be cast to bytes)
                parts.append(array.data.cast("B"))
    return parts


def pack(header: dict[str, Any], arrays: Mapping[str, np.ndarray | tuple[np.ndarray, ...]]) -> bytes:
    """:func:`pack_parts` as one byte string."""
    return b"".join(pack_parts(header, arrays))


def unpack(data: bytes | memoryview, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`.

    Raises:
        CorruptTraceError: ``data`` is not a complete journal file (``what`` names it in the message).
    """
    if bytes(data[:8]) in _OLD_MAGICS:
        raise CorruptTraceError(f"{what} was written by an older memprof (journal version {data[4]}), which this one "
                                "does not read; the iterations its worker had written are readable, profile the run "
                                "again for the others")
    if len(data) < _HEAD.size or data[:8] != _MAGIC:
        raise CorruptTraceError(f"{what} is not a memprof journal file (expected the {_MAGIC[:4].decode()} "
                                f"version 3 header, found {bytes(data[:8])!r})")
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


_NONE = {width: np.zeros((0, width), dtype=np.int64) for width in (2, 3, 4)}  # (a steady record's usual lists)


def _flat(rows: list, width: int) -> np.ndarray:
    if not rows:
        return _NONE[width]
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=width * len(rows)).reshape(-1, width)


def _storage_rows(storages: dict[int, tuple[int, int]]) -> np.ndarray:
    return _flat([(i, p, n) for i, (p, n) in storages.items()], 3)


def _with_storages(rows: list, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose last item is a list of storages: ``width`` columns plus its length, and the storages."""
    if not rows:
        return np.zeros((0, width + 1), dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
    count = len(rows)
    *columns, payloads = zip(*rows)
    # Row-major as written, one column at a time: np.array of the columns, transposed, cost a copy when packed,
    # and converting the marks' kinds (IntEnum members) in one 2-D np.array took numpy's slow path.
    head = np.empty((count, width + 1), dtype=np.int64)
    for at, column in enumerate(columns):
        head[:, at] = np.fromiter(column, dtype=np.int64, count=count)
    head[:, width] = np.fromiter(map(len, payloads), dtype=np.int64, count=count)
    return head, _flat(list(chain.from_iterable(payloads)), 2)


def _unflatten(head: list[list[int]], flat: list[list[int]]) -> list[tuple]:
    """Inverse of :func:`_with_storages` (after ``tolist()``)."""
    rows, at = [], 0
    for *columns, count in head:
        rows.append((*columns, [tuple(s) for s in flat[at:at + count]]))
        at += count
    return rows


# ---------------------------------------------------------------------------------------------- records
def encode_record(record: IterationRecord) -> bytes:
    """Serialises one iteration's record (see :func:`decode_record`)."""
    return b"".join(encode_record_parts(record))


def encode_record_parts(record: IterationRecord, template_inline: bool = True) -> list[bytes | memoryview]:
    """:func:`encode_record` as buffers to write one after another (no joined copy).

    Args:
        record: the record.
        template_inline: write a steady record's template with it; ``False`` names it only (the journal's
            writer puts it in a frame of its own, :func:`encode_template_parts`).
    """
    head, storage = _with_storages(record.marks, 3)
    ev = record.events
    header = {"kind": "record", "iteration": record.iteration, "epoch": record.epoch, "start_ns": record.start_ns,
              "end_ns": record.end_ns, "reserved_bytes": record.reserved_bytes,
              "peak_reserved_bytes": record.peak_reserved_bytes, "failed": record.failed, "detail": record.detail}
    arrays: dict[str, np.ndarray | tuple[np.ndarray, ...]] = {
        "events": (ev.time_ns, ev.ptr, ev.size_bytes, ev.total_allocated_bytes, ev.total_reserved_bytes),
        "marks": head, "mark_storages": storage,
        "observations": _flat(record.observations, 4), "frees": _flat(record.frees, 2),
        "param_grads": _storage_rows(record.param_grads), "grads": _storage_rows(record.grads),
    }
    template = record.template
    if template is not None:
        header["template"] = template.iteration
        if template_inline:
            arrays.update(_template_arrays(template))
    return pack_parts(header, arrays)


def encode_template_parts(template: MarkTemplate) -> list[bytes | memoryview]:
    """A template's own payload (see :func:`decode_payload`): its arrays, written as they are."""
    return pack_parts({"kind": "template", "iteration": template.iteration}, _template_arrays(template))


def _template_arrays(template: MarkTemplate) -> dict[str, np.ndarray]:
    return {"template_sizes": template.sizes, "template_pairing": template.pairing,
            "template_marks": template.marks, "template_storages": template.storages,
            "template_observations": template.observations, "template_param_grads": template.param_grads}


def decode_record(data: bytes | memoryview, what: str = "a journal record",
                  templates: Mapping[int, MarkTemplate] | None = None) -> IterationRecord:
    """Rebuilds an :class:`IterationRecord` from :func:`encode_record`'s bytes.

    Args:
        data: the record's payload.
        what: names it in errors.
        templates: the templates read before it, by iteration, for a record that names its template only.

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
    header, arrays = unpack(data, what)
    if header.get("kind") != "template":
        return _record(header, arrays, what, templates)
    try:
        template = _template_from(int(header["iteration"]), arrays)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptTraceError(f"{what} is damaged ({exc!r}); it cannot be read") from None
    templates[template.iteration] = template
    return None


def _record(header: dict[str, Any], a: dict[str, np.ndarray], what: str,
            templates: Mapping[int, MarkTemplate]) -> IterationRecord:
    if "node_rows" in a or "watches" in a:
        raise CorruptTraceError(f"{what} was written by an older memprof, whose backward marks came from its native "
                                "reporter and are not replayed any more; profile the run again")
    try:
        ev = a["events"]
        events = AllocationEvents(*(np.ascontiguousarray(ev[i]) for i in range(5)))
        marks = _unflatten(a["marks"].tolist(), a["mark_storages"].tolist())
        return IterationRecord(
            iteration=int(header["iteration"]), epoch=int(header["epoch"]), start_ns=int(header["start_ns"]),
            end_ns=int(header["end_ns"]), events=events, marks=marks,
            observations=a["observations"].tolist(), frees=a["frees"].tolist(),
            param_grads={i: (p, n) for i, p, n in a["param_grads"].tolist()},
            grads={i: (p, n) for i, p, n in a["grads"].tolist()},
            reserved_bytes=int(header["reserved_bytes"]), peak_reserved_bytes=int(header["peak_reserved_bytes"]),
            failed=bool(header["failed"]), detail=bool(header.get("detail", False)),
            template=_template(header, a, templates))
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise CorruptTraceError(f"{what} is damaged ({exc!r}); it cannot be read") from None


def _template(header: dict[str, Any], arrays: dict[str, np.ndarray],
              templates: Mapping[int, MarkTemplate]) -> MarkTemplate | None:
    if "template" not in header:
        return None
    iteration = int(header["template"])
    if "template_sizes" in arrays:
        return _template_from(iteration, arrays)
    found = templates.get(iteration)
    if found is None:
        raise ValueError(f"it names the template of iteration {iteration}, which no frame before it holds")
    return found


def _template_from(iteration: int, arrays: dict[str, np.ndarray]) -> MarkTemplate:
    marks, storages = arrays["template_marks"].reshape(-1, 4), arrays["template_storages"].reshape(-1, 3)
    if int(marks[:, 3].sum()) != len(storages):
        raise ValueError(f"the template's marks name {int(marks[:, 3].sum())} storages, {len(storages)} follow")
    return MarkTemplate(iteration=iteration, sizes=arrays["template_sizes"],
                        pairing=arrays["template_pairing"], marks=marks, storages=storages,
                        observations=arrays["template_observations"].reshape(-1, 4),
                        param_grads=arrays["template_param_grads"].reshape(-1, 4))


def frames(data: bytes, offset: int = 0) -> Iterator[tuple[int, memoryview]]:
    """Complete, intact frames of a segment from ``offset``: ``(offset after it, payload)``.

    Stops at the first incomplete or damaged frame: the tail a killed writer left.

    Raises:
        CorruptTraceError: the segment was written by an older memprof (whose frames this one does not read).
    """
    view = memoryview(data)
    while offset + _FRAME.size <= len(data):
        magic, checksum, length = _FRAME.unpack_from(data, offset)
        end = offset + _FRAME.size + length
        if magic == _OLD_FRAME_MAGIC:
            raise CorruptTraceError("the journal was written by an older memprof, whose records this one does not "
                                    "read; the iterations its worker had written are readable")
        if magic != _FRAME_MAGIC or end > len(data):
            return
        payload = view[offset + _FRAME.size:end]
        if zlib.crc32(payload) != checksum:
            return
        offset = end
        yield offset, payload


def _framed(parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """``parts`` behind their frame's head (in place)."""
    checksum = length = 0
    for part in parts:
        checksum = zlib.crc32(part, checksum)
        length += len(part)  # (a cast memoryview's len is its bytes)
    parts.insert(0, _FRAME.pack(_FRAME_MAGIC, checksum, length))
    return parts


class JournalWriter:
    """Appends records to the journal's segment files (one ``write`` per record, no new file per step).

    Args:
        journal_dir: the journal folder (must exist).
    """

    def __init__(self, journal_dir: Path) -> None:
        self.journal_dir = journal_dir
        self._fd: int | None = None
        self._path: Path | None = None
        self._first = -1  # the first iteration of the open segment (comparing Paths every record cost 50 µs)
        self._templates: set[int] = set()  # the templates the open segment holds

    def append(self, record: IterationRecord) -> None:
        """Writes ``record`` at the end of its segment.

        Raises:
            OSError: it could not be written (a partial frame is ignored by every reader).
        """
        fd = self._fd
        first = record.iteration - record.iteration % SEGMENT_RECORDS
        if first != self._first or fd is None:
            self.close()
            path = segment_path(self.journal_dir, record.iteration)
            fd = self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._path, self._first = path, first
        parts = _framed(encode_record_parts(record, template_inline=False))
        fresh = record.template if record.template is not None and record.template.iteration not in self._templates \
            else None
        if fresh is not None:  # the segment's first record that names it: its frame goes first
            parts = _framed(encode_template_parts(fresh)) + parts
        total = sum(len(part) for part in parts)
        written = os.writev(fd, parts)
        if written < total:  # a short write (rare on regular files): write the rest in one piece
            rest = memoryview(b"".join(parts))[written:]
            while rest:
                rest = rest[os.write(fd, rest):]
        if fresh is not None:
            self._templates.add(fresh.iteration)

    def close(self) -> None:
        """Closes the open segment."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._path, self._first = None, None, -1
        self._templates = set()


class JournalReader:
    """Reads the records after a given iteration, in order, as they reach the journal.

    Args:
        journal_dir: the journal folder.
        last_iteration: the last iteration already processed (-1: none).
    """

    def __init__(self, journal_dir: Path, last_iteration: int) -> None:
        self.journal_dir = journal_dir
        self.expected = last_iteration + 1
        self._path: Path | None = None
        self._offset = 0  # where the next frame not yet returned starts in the segment
        # Frames read but not yet returned: (offset after the frame, payload). A reader that fell behind
        # reads the segment's tail once, not once per record.
        self._frames: list[tuple[int, memoryview]] = []
        self._next_frame = 0
        self._templates: dict[int, MarkTemplate] = {}  # the segment's templates read so far

    def next(self) -> IterationRecord | None:
        """The next record, or ``None`` when it is not (completely) on disk yet.

        Raises:
            CorruptTraceError: a record is damaged or out of order.
        """
        path = segment_path(self.journal_dir, self.expected)
        if path != self._path:
            self._path, self._offset, self._frames, self._next_frame, self._templates = path, 0, [], 0, {}
        while True:
            if self._next_frame >= len(self._frames) and not self._read(path):
                return None
            end, payload = self._frames[self._next_frame]
            self._next_frame += 1
            record = decode_payload(payload, f"a record in {path}", self._templates)
            self._offset = end
            if record is None:  # a template, for the records after it
                continue
            if record.iteration < self.expected:
                continue  # processed before a restart
            if record.iteration > self.expected:
                raise CorruptTraceError(f"{path} holds iteration {record.iteration} where {self.expected} was "
                                        "expected; the journal is incomplete")
            self.expected += 1
            return record

    def _read(self, path: Path) -> bool:
        """Reads the complete frames after :attr:`_offset`; whether there were any."""
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return False
        start = self._offset
        self._frames = [(start + end, payload) for end, payload in frames(data)]
        self._next_frame = 0
        return bool(self._frames)


# ---------------------------------------------------------------------------------------------- spec, state
def write_spec(journal_dir: Path, spec: RunSpec) -> None:
    """Writes the run's spec (atomically)."""
    write_atomically(journal_dir / SPEC_FILE, json.dumps(spec.to_json()).encode())


def read_spec(journal_dir: Path) -> RunSpec:
    """Reads the run's spec.

    Raises:
        CorruptTraceError: the file is not a spec.
    """
    path = journal_dir / SPEC_FILE
    try:
        return RunSpec.from_json(json.loads(path.read_bytes()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptTraceError(f"{path} is not a memprof journal spec ({exc!r})") from None


def write_state(journal_dir: Path, state: CarriedState) -> None:
    """Writes the carried state (atomically), then deletes the segments it makes redundant."""
    header = {"kind": "state", "last_iteration": state.last_iteration, "next_block_id": state.next_block_id,
              "order": [[m, o] for m, o in state.order.items()], "detailed_peak_bytes": state.detailed_peak_bytes}
    arrays = {"blocks": block_table(state.blocks)}
    write_atomically(journal_dir / STATE_FILE, pack(header, arrays))
    for first in segment_starts(journal_dir):
        if first + SEGMENT_RECORDS - 1 <= state.last_iteration:
            (journal_dir / f"seg-{first:09d}{_SEGMENT_SUFFIX}").unlink(missing_ok=True)


def read_state(journal_dir: Path) -> CarriedState:
    """Reads the carried state.

    Raises:
        CorruptTraceError: the file is not a state.
        OSError: it cannot be read.
    """
    path = journal_dir / STATE_FILE
    header, arrays = unpack(path.read_bytes(), str(path))
    try:
        if len(arrays.get("watches", ())):  # an older memprof's backward marks waiting on the next iteration
            raise CorruptTraceError(f"{path} was written by an older memprof whose backward marks came from its "
                                    "native reporter; profile the run again")
        blocks = BlockTable(arrays["blocks"])
        return CarriedState(int(header["last_iteration"]), blocks, int(header["next_block_id"]),
                            {int(m): int(o) for m, o in header["order"]},
                            int(header.get("detailed_peak_bytes", 0)))
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptTraceError(f"{path} is damaged ({exc!r}); it cannot be read") from None
