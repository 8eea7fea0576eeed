"""What the training process records about one iteration, before any analysis.

Torch-free on purpose: the background worker (:mod:`memprof.trace.worker`) and the trace reader's
recovery of a killed run (:mod:`memprof.trace.journal`) analyse these records without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from memprof.categories import CATEGORIES

#: Category codes used in observations and blocks (index into ``CATEGORIES``).
CAT = {c: i for i, c in enumerate(CATEGORIES)}

Storage = tuple[int, int]  # (data_ptr, nbytes)

#: Columns of the native reporter's backward-node rows (see :mod:`memprof.analysis.backward_replay`).
NODE_COLUMNS = 5


def no_node_rows() -> np.ndarray:
    """An empty block of backward-node rows."""
    return np.zeros((0, NODE_COLUMNS), dtype=np.int64)


class Mark(IntEnum):
    """Kinds of timeline marks recorded by the hooks."""

    FWD_ENTER = 0
    FWD_EXIT = 1
    BWD_ENTER = 2
    BWD_EXIT = 3
    BWD_END = 4
    OPT_ENTER = 5
    OPT_EXIT = 6


@dataclass(frozen=True)
class AllocationEvents:
    """A batch of allocator events, in time order.

    Attributes:
        time_ns: event time (Unix epoch ns, the clock of ``time.time_ns()``).
        ptr: block address.
        size_bytes: bytes allocated (> 0) or freed (< 0).
        total_allocated_bytes: the allocator's running total after the event (process-relative on CPU).
        total_reserved_bytes: the allocator's reserved bytes after the event (0 on CPU).
    """

    time_ns: np.ndarray
    ptr: np.ndarray
    size_bytes: np.ndarray
    total_allocated_bytes: np.ndarray
    total_reserved_bytes: np.ndarray

    @staticmethod
    def empty() -> AllocationEvents:
        """An empty batch."""
        z = np.zeros(0, dtype=np.int64)
        return AllocationEvents(z, z, z, z, z)

    def __len__(self) -> int:
        return int(self.time_ns.shape[0])


class Drained(NamedTuple):
    """What :meth:`memprof.capture.hooks.HookRecorder.drain` hands over: one iteration's raw observations.

    Attributes:
        marks: ``(time_ns, Mark, module index, storages)`` in call order.
        observations: ``(time_ns, data_ptr, category code, nbytes)``.
        param_grads: parameter index -> its gradient's storage, seen when accumulated.
        frees: ``(time_ns, data_ptr)`` of watched pre-existing storages that died.
        node_rows: the native reporter's backward-node rows (native mode; else empty).
        watches: ``(sequence_nr, Mark, module index, token, output_nr)`` (native mode).
        candidates: backward marks offered by Python hooks (native mode).
    """

    marks: list
    observations: list
    param_grads: dict[int, Storage]
    frees: list
    node_rows: np.ndarray
    watches: list
    candidates: list


@dataclass(frozen=True)
class IterationRecord:
    """Everything the training process saw in one iteration: the input of the analysis.

    Attributes:
        iteration: its number (0-based).
        epoch: the epoch it belongs to.
        start_ns: when it began (``time.time_ns()``).
        end_ns: when ``record_stats()`` ended it.
        reserved_bytes: the allocator's reserved bytes at its end (0 without a caching allocator).
        peak_reserved_bytes: the highest reserved bytes seen during it.
        failed: the iteration was cut short by an out-of-memory error or the budget guard.
        events: the allocator's events.
        marks: ``(time_ns, Mark, module index, storages)`` from the hooks, in call order.
        observations: ``(time_ns, data_ptr, category code, nbytes)``: a storage seen in a role no mark
            implies (a mark's own storages are observed from the mark when it is analysed).
        frees: ``(time_ns, data_ptr)`` of watched pre-existing storages that died (CPU).
        param_grads: parameter index -> storage of its gradient, seen when it was accumulated.
        grads: parameter index -> storage of its ``.grad`` at the iteration's end.
        backward_thread: RecordFunction's id of the training thread (-1: backward marks are in
            ``marks`` already, made by Python hooks).
        node_rows: the native reporter's backward-node rows, ``watches`` the forward hooks' watches
            and ``candidates`` the marks Python hooks offered: raw material of the backward marks,
            which the analysis replays (:func:`memprof.analysis.backward_replay.replay_backward`).
    """

    iteration: int
    epoch: int
    start_ns: int
    end_ns: int
    events: AllocationEvents
    marks: list = field(default_factory=list)
    observations: list = field(default_factory=list)
    frees: list = field(default_factory=list)
    param_grads: dict[int, Storage] = field(default_factory=dict)
    grads: dict[int, Storage] = field(default_factory=dict)
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0
    failed: bool = False
    backward_thread: int = -1
    node_rows: np.ndarray = field(default_factory=no_node_rows)
    watches: list = field(default_factory=list)
    candidates: list = field(default_factory=list)
