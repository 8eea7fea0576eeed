"""``export_snapshot``: a memprof trace as a PyTorch memory snapshot that ``memory_viz`` opens.

A trace knows bytes per category at each event row, not single allocations, so the snapshot's allocations
are synthesised: between consecutive states (an event row, or a point the rows imply) each category that
grew gets one allocation of the difference, each that shrank frees its newest blocks (and allocates back
what it freed beyond the difference), frees before allocations, so the allocated bytes between two states
never exceed the larger of them. Where a row's ``peak_bytes`` lies above both of its neighbours, a transient
``other`` allocation reaches it; in the window where the iteration's peak lies, the state at the peak (its
categories from the ``iterations`` row) is visited. Iterations without detail visit their peak and an end
state (the peak's, less ``other``, ``grads``, ``feature_maps`` ... down to ``allocated_bytes``).

Each block has its own segment (``segment_alloc`` before its ``alloc``, ``segment_free`` after its
``free_completed``), addresses are never reused, and every entry carries the ``category`` memory_viz colours
by and frames naming its category, module, phase and iteration (:func:`memprof.interop.frames.memprof_frames`),
which :func:`memprof.interop.importer.import_snapshot` reads back exactly. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memprof.categories import CATEGORY_COLUMNS, Category
from memprof.errors import OutputExistsError
from memprof.interop.frames import memprof_frames
from memprof.interop.snapshot_file import write_snapshot
from memprof.trace.folder import load_trace

_FIRST_ADDRESS = 0x7F0000000000
_ALIGN = 512
#: Categories an iteration without detail gives back first on its way from its peak to its end.
_RELEASE_ORDER = (Category.OTHER, Category.GRADS, Category.FEATURE_MAPS, Category.WEIGHT_COPIES, Category.INPUTS,
                  Category.OPTIMIZER_STATE, Category.COMM_BUFFERS, Category.WEIGHT_GRADS, Category.BUFFERS,
                  Category.WEIGHTS)
_OTHER = CATEGORY_COLUMNS.index(Category.OTHER.value)
Label = tuple[int, str, str, str]  # iteration, phase, module, event


class _Writer:
    """Synthesises allocations between states and records them as trace entries."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.entries: list[dict[str, Any]] = []
        self.live: list[list[tuple[int, int, list[dict[str, Any]]]]] = [[] for _ in CATEGORY_COLUMNS]
        self.state = np.zeros(len(CATEGORY_COLUMNS), dtype=np.int64)
        self.next_address = _FIRST_ADDRESS
        self.time_us = 0
        # one list per distinct label, shared by its entries (pickle then stores it once, as PyTorch's does)
        self._frames: dict[tuple[int, Label], list[dict[str, Any]]] = {}

    def frames(self, code: int, label: Label) -> list[dict[str, Any]]:
        """The frames of an entry of category ``code`` made at ``label``."""
        found = self._frames.get((code, label))
        if found is None:
            iteration, phase, module, event = label
            found = self._frames[(code, label)] = memprof_frames(CATEGORY_COLUMNS[code], phase, module, iteration,
                                                                 event)
        return found

    def go(self, target: np.ndarray, label: Label, time_ns: int | None) -> None:
        """Frees and allocates so that the live bytes per category become ``target``."""
        self.time_us = max(self.time_us, time_ns // 1000) if time_ns is not None else self.time_us + 1
        pending: list[tuple[int, int]] = []
        for code, (have, want) in enumerate(zip(self.state.tolist(), target.tolist())):
            freed = 0
            while have - freed > want:
                addr, size, frames = self.live[code].pop()
                self._free(addr, size, code, label)
                freed += size
            if have - freed < want:
                pending.append((code, want - (have - freed)))
        for code, size in pending:
            self._alloc(size, code, label)
        self.state = np.asarray(target, dtype=np.int64).copy()

    def _entry(self, action: str, addr: int, size: int, code: int, frames: list[dict[str, Any]]) -> None:
        category = "unknown" if action.startswith("segment") else CATEGORY_COLUMNS[code]
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.time_us,
                             "frames": frames, "category": category})

    def _alloc(self, size: int, code: int, label: Label) -> None:
        frames = self.frames(code, label)
        addr = self.next_address
        self.next_address += -(-size // _ALIGN) * _ALIGN
        self._entry("segment_alloc", addr, size, code, frames)
        self._entry("alloc", addr, size, code, frames)
        self.live[code].append((addr, size, frames))

    def _free(self, addr: int, size: int, code: int, label: Label) -> None:
        frames = self.frames(code, label)
        for action in ("free_requested", "free_completed", "segment_free"):
            self._entry(action, addr, size, code, frames)

    def snapshot(self) -> dict[str, Any]:
        """The snapshot dict: one segment per live block, the trace on this writer's device."""
        segments = []
        for blocks in self.live:
            for addr, size, frames in blocks:
                block = {"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                         "frames": frames}
                segments.append({"device": self.device, "address": addr, "total_size": size, "allocated_size": size,
                                 "active_size": size, "requested_size": size, "stream": 0,
                                 "segment_type": "large" if size > 1 << 20 else "small", "segment_pool_id": (0, 0),
                                 "is_expandable": False, "frames": frames, "blocks": [block]})
        segments.sort(key=lambda s: s["address"])
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device)] + [self.entries]
        return {"segments": segments, "device_traces": traces}


def export_snapshot(run_dir: str | Path, out_path: str | Path, *, force: bool = False) -> Path:
    """Writes a memprof run as a PyTorch memory snapshot (a pickle ``memory_viz`` and :mod:`torch.cuda._memory_viz`
    read).

    Args:
        run_dir: a run directory (one rank of a distributed run).
        out_path: the ``.pickle`` file to write (atomically).
        force: replace ``out_path`` if it exists.

    Raises:
        TraceError: the run cannot be read.
        OutputExistsError: ``out_path`` exists and ``force`` is false.
    """
    out = Path(out_path)
    if out.exists() and not force:
        raise OutputExistsError(f"{out} already exists; choose another --out or pass --force to replace it")
    return write_snapshot(out, snapshot_of(run_dir))


def snapshot_of(run_dir: str | Path) -> dict[str, Any]:
    """The snapshot dict of a run (see the module docstring)."""
    trace = load_trace(run_dir)
    found = re.fullmatch(r"cuda:(\d+)", str(trace.meta.get("device", "")))
    writer = _Writer(int(found.group(1)) if found else 0)
    rows = trace.iterations.sort_values("iteration", kind="stable")
    detailed = trace.detail_iterations
    events = _Events(trace.read("events", iterations=detailed).sort_values(["iteration", "seq"], kind="stable")
                     if detailed else None)
    for row in rows.to_dict("records"):
        lo, hi = events.span(int(row["iteration"]))
        if hi > lo:
            _detailed(writer, row, events, lo, hi)
        else:
            _summary_only(writer, row)
    return writer.snapshot()


class _Events:
    """The events table as arrays, to walk row by row without pandas' per-row cost."""

    def __init__(self, frame: pd.DataFrame | None) -> None:
        frame = frame if frame is not None else pd.DataFrame({c: [] for c in ("iteration", *_EVENT_COLUMNS)})
        self.iteration = frame["iteration"].to_numpy(dtype=np.int64)
        self.time_ns = frame["time_ns"].to_numpy(dtype=np.int64)
        self.peak_bytes = frame["peak_bytes"].to_numpy(dtype=np.int64)
        self.text = list(zip(frame["phase"].astype(str), frame["module"].astype(str), frame["event"].astype(str)))
        self.categories = (frame[list(CATEGORY_COLUMNS)].to_numpy(dtype=np.int64) if len(frame)
                           else np.zeros((0, len(CATEGORY_COLUMNS)), dtype=np.int64))

    def span(self, iteration: int) -> tuple[int, int]:
        """The rows of ``iteration``: ``[lo, hi)``."""
        return (int(np.searchsorted(self.iteration, iteration, "left")),
                int(np.searchsorted(self.iteration, iteration, "right")))


_EVENT_COLUMNS = ("time_ns", "peak_bytes", "phase", "module", "event", *CATEGORY_COLUMNS)


def _categories(record: Mapping[str, Any]) -> np.ndarray:
    return np.asarray([int(record[name]) for name in CATEGORY_COLUMNS], dtype=np.int64)


def _detailed(writer: _Writer, row: Mapping[str, Any], events: _Events, lo: int, hi: int) -> None:
    iteration, peak = int(row["iteration"]), int(row["peak_allocated_bytes"])
    at_peak = _categories(row)
    peak_label: Label = (iteration, str(row["peak_phase"]), str(row["peak_module"]), "peak")
    visited_peak = False
    for i in range(lo, hi):
        target = events.categories[i]
        label: Label = (iteration, *events.text[i])
        time_ns = int(events.time_ns[i])
        before, after = int(writer.state.sum()), int(target.sum())
        window_peak = int(events.peak_bytes[i])
        if not visited_peak and window_peak >= peak:
            visited_peak = True
            reached = (before == peak and np.array_equal(writer.state, at_peak)) or (
                after == peak and np.array_equal(target, at_peak))
            if not reached:
                writer.go(at_peak, peak_label, time_ns)
        elif window_peak > max(before, after):
            transient = writer.state.copy()
            transient[_OTHER] += window_peak - before
            writer.go(transient, label, time_ns)
        writer.go(target, label, time_ns)


def _summary_only(writer: _Writer, row: Mapping[str, Any]) -> None:
    iteration = int(row["iteration"])
    at_peak = _categories(row)
    writer.go(at_peak, (iteration, str(row["peak_phase"]), str(row["peak_module"]), "peak"), None)
    end = at_peak.copy()
    excess = int(end.sum()) - int(row["allocated_bytes"])
    for category in _RELEASE_ORDER:
        code = CATEGORY_COLUMNS.index(category.value)
        taken = min(excess, int(end[code]))
        end[code] -= taken
        excess -= taken
    writer.go(end, (iteration, "other", "", "end"), None)
