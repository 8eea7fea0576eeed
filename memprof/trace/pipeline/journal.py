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

The payloads' bytes (records, templates, the state) are :mod:`memprof.trace.pipeline.payloads`'.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from memprof.analysis.records import (
    BlockTable,
    CarriedState,
    IterationRecord,
    MarkTemplate,
    RunSpec,
    block_table,
)
from memprof.atomic import write_atomically
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.payloads import (
    Buffer,
    decode_payload,
    encode_record_parts,
    encode_template_parts,
    pack,
    unpack,
)

JOURNAL_DIR = ".journal"
SPEC_FILE = "spec.json"
STATE_FILE = "state.bin"
_SEGMENT_SUFFIX = ".log"
#: Records per segment file; the worker deletes a segment once all its iterations are in the tables.
SEGMENT_RECORDS = 64
_FRAME = struct.Struct("<4sIQ")  # magic, CRC-32 of the payload, payload length
_FRAME_MAGIC = b"MPF3"
_OLD_FRAME_MAGIC = b"MPRF"  # versions 1 and 2 (Adler-32)


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


def _framed(parts: list[Buffer]) -> list[Buffer]:
    """``parts`` behind their frame's head (in place)."""
    checksum = length = 0
    for part in parts:
        checksum = zlib.crc32(part, checksum)
        length += memoryview(part).nbytes
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
        parts = _framed(encode_record_parts(record))
        fresh = record.template if record.template is not None and record.template.iteration not in self._templates \
            else None
        if fresh is not None:  # the segment's first record that names it: its frame goes first
            parts = _framed(encode_template_parts(fresh)) + parts
        total = sum(memoryview(part).nbytes for part in parts)
        written = os.writev(fd, parts)
        if written < total:  # a short write (rare on regular files): write the rest in one piece
            rest = memoryview(b"".join(bytes(memoryview(part)) for part in parts))[written:]
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
        blocks = BlockTable(arrays["blocks"])
        return CarriedState(int(header["last_iteration"]), blocks, int(header["next_block_id"]),
                            {int(m): int(o) for m, o in header["order"]},
                            int(header.get("detailed_peak_bytes", 0)))
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptTraceError(f"{path} is damaged ({exc!r}); it cannot be read") from None
