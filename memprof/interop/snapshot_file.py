"""Reading and writing PyTorch CUDA memory snapshots (what ``torch.cuda.memory._dump_snapshot`` pickles).

A snapshot is a pickled dict of builtins (dicts, lists, tuples, strings, numbers). Unpickling runs code named
by the file, so :func:`load_snapshot` uses an unpickler that refuses every global: a pickle that names one
(``os.system``, a class, even ``builtins.eval``) is refused before anything it names is looked up. Only the
few builtin containers older pickle protocols name as globals (``set``, ``frozenset``) are allowed.

:func:`check_snapshot` validates the fields memprof reads (``docs/trace-format.md``, "PyTorch snapshots"),
naming the first one that is missing or of the wrong type. Torch-free.
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprof.atomic import atomic_path
from memprof.errors import SnapshotFormatError

#: The pickle protocol of exported snapshots: memory_viz's own unpickler (MemoryViz.js) reads 2 to 4.
PICKLE_PROTOCOL = 4
#: Globals a snapshot's pickle may name: builtin containers that protocols below 4 spell as globals.
_ALLOWED_GLOBALS = frozenset({("builtins", "set"), ("builtins", "frozenset"), ("__builtin__", "set"),
                              ("__builtin__", "frozenset")})
#: Trace actions memprof reads, and the keys each must have.
ACTIONS_WITH_ADDRESS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                                  "segment_map", "segment_unmap"})
KNOWN_ACTIONS = ACTIONS_WITH_ADDRESS | {"oom", "snapshot"}
BLOCK_STATES = frozenset({"active_allocated", "active_pending_free", "inactive"})
#: Addresses, sizes and times are int64 in the trace's tables.
_LIMIT = 2**63


class _Refused(Exception):
    """The pickle names a global that a snapshot never needs."""


class _SnapshotUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return {"set": set, "frozenset": frozenset}[name]
        raise _Refused(f"{module}.{name}")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Reads a snapshot file safely and checks its structure.

    Raises:
        SnapshotFormatError: the file is missing, not a pickle, a pickle naming a global (never loaded), or
            not a snapshot dict (the message names the first missing or malformed field).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotFormatError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    try:
        snapshot = _SnapshotUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise SnapshotFormatError(
            f"{path} is a pickle that refers to {exc} (code or a class); a PyTorch memory snapshot holds only "
            "dicts, lists, strings and numbers, so memprof refuses to load it") from None
    except Exception as exc:  # any failure of the unpickler means "not a pickle memprof can read"
        raise SnapshotFormatError(
            f"{path} is not a readable pickle ({type(exc).__name__}: {exc}); expected a PyTorch memory snapshot "
            "written by torch.cuda.memory._dump_snapshot") from None
    check_snapshot(snapshot, str(path))
    return snapshot


def write_snapshot(path: str | Path, snapshot: Mapping[str, Any]) -> Path:
    """Pickles ``snapshot`` to ``path`` atomically (protocol 4, which memory_viz reads).

    Raises:
        OSError: the file could not be written; ``path`` is unchanged.
    """
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        pickle.dump(dict(snapshot), handle, protocol=PICKLE_PROTOCOL)
    return Path(path)


def check_snapshot(snapshot: Any, where: str = "snapshot") -> None:
    """Checks the fields memprof reads; raises :class:`SnapshotFormatError` naming the first bad one."""
    if isinstance(snapshot, list):
        raise SnapshotFormatError(
            f"{where} holds a list (the segments of torch.cuda.memory_snapshot()); expected the dict that "
            "torch.cuda.memory._snapshot() returns and _dump_snapshot writes, with 'segments' and 'device_traces'")
    if not isinstance(snapshot, dict):
        raise SnapshotFormatError(f"{where} holds a {type(snapshot).__name__}; expected a PyTorch memory snapshot "
                                  "(a dict with 'segments' and 'device_traces')")
    for key in ("segments", "device_traces"):
        if key not in snapshot:
            raise SnapshotFormatError(f"{where} lacks the key {key!r}: expected a PyTorch memory snapshot written by "
                                      "torch.cuda.memory._dump_snapshot (keys 'segments' and 'device_traces')")
    segments, traces = snapshot["segments"], snapshot["device_traces"]
    _require(isinstance(segments, list), f"{where}: 'segments' must be a list, found {type(segments).__name__}")
    _require(isinstance(traces, list), f"{where}: 'device_traces' must be a list, found {type(traces).__name__}")
    checked: set[int] = set()  # PyTorch shares one list between the entries of one stack: check it once
    for i, segment in enumerate(segments):
        _check_segment(segment, f"{where}: segments[{i}]", checked)
    for d, trace in enumerate(traces):
        _require(isinstance(trace, list), f"{where}: device_traces[{d}] must be a list, found {type(trace).__name__}")
        for i, entry in enumerate(trace):
            _check_entry(entry, f"{where}: device_traces[{d}][{i}]", checked)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SnapshotFormatError(message)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    """A whole number that fits the trace's int64 columns, >= 0."""
    return _whole(value) and 0 <= value < _LIMIT


def _check_segment(segment: Any, where: str, checked: set[int]) -> None:
    _require(isinstance(segment, dict), f"{where} must be a dict, found {type(segment).__name__}")
    for key in ("address", "total_size"):
        _require(key in segment, f"{where} lacks {key!r}")
        _require(_count(segment[key]), f"{where}: {key!r} must be a whole number >= 0, found {segment[key]!r}")
    device = segment.get("device", 0)
    _require(_whole(device) and device >= 0, f"{where}: 'device' must be a whole number >= 0, found {device!r}")
    blocks = segment.get("blocks", [])
    _require(isinstance(blocks, list), f"{where}: 'blocks' must be a list, found {type(blocks).__name__}")
    for i, block in enumerate(blocks):
        here = f"{where}.blocks[{i}]"
        _require(isinstance(block, dict), f"{here} must be a dict, found {type(block).__name__}")
        _require("size" in block and _count(block["size"]), f"{here} lacks a whole 'size' >= 0 (found "
                                                          f"{block.get('size')!r})")
        _require(_count(block.get("requested_size", 0)), f"{here}: 'requested_size' must be a whole number >= 0, "
                                                         f"found {block.get('requested_size')!r}")
        state = block.get("state")
        _require(isinstance(state, str) and state in BLOCK_STATES,
                 f"{here}: 'state' must be one of {sorted(BLOCK_STATES)}, found {state!r}")
        _check_frames(block.get("frames", []), here, checked)


def _check_entry(entry: Any, where: str, checked: set[int]) -> None:
    _require(isinstance(entry, dict), f"{where} must be a dict, found {type(entry).__name__}")
    action = entry.get("action")
    _require(isinstance(action, str), f"{where} lacks an 'action' string (found {action!r})")
    if action in ACTIONS_WITH_ADDRESS:
        for key in ("addr", "size"):
            _require(key in entry, f"{where} ({action}) lacks {key!r}")
            _require(_count(entry[key]), f"{where}: {key!r} must be a whole number >= 0, found {entry[key]!r}")
    time_us = entry.get("time_us", 0)
    _require((_whole(time_us) or (isinstance(time_us, float) and math.isfinite(time_us)))
             and abs(time_us) < _LIMIT // 1000, f"{where}: 'time_us' must be a finite number of microseconds, "
                                                 f"found {time_us!r}")
    if action == "oom":
        for key in ("size", "device_free"):
            value = entry.get(key, 0)
            _require(_count(value), f"{where}: {key!r} must be a whole number >= 0, found {value!r}")
    _check_frames(entry.get("frames", []), where, checked)


def _check_frames(frames: Any, where: str, checked: set[int]) -> None:
    if id(frames) in checked:
        return
    _require(isinstance(frames, list), f"{where}: 'frames' must be a list, found {type(frames).__name__}")
    for frame in frames:
        _require(isinstance(frame, dict), f"{where}: a frame must be a dict, found {type(frame).__name__}")
        for key, kind in (("filename", str), ("name", str), ("line", int)):
            _require(isinstance(frame.get(key, kind()), kind) and not isinstance(frame.get(key), bool),
                     f"{where}: a frame's {key!r} must be a {kind.__name__}, found {frame.get(key)!r}")
    checked.add(id(frames))
