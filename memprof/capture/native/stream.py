"""Allocator events from memprof's native reporter (the choice between sources: :mod:`memprof.capture.streams`).

The reporter (``memprof/capture/native/reporter.cpp``) sits in PyTorch's profiler slot of the thread that
started it, as torch.profiler would, and appends one row per allocation or free to a buffer: no
operator is recorded and nothing is restarted, so an iteration's events cost a copy to collect. The
slot is per thread, like torch.profiler's: the autograd engine carries it into backward, including
CUDA's device threads. A thread that does not carry it (gloo's, which drops the last reference to a
collective's tensors; a pin-memory thread) would free CPU blocks unseen: while recording a CPU device, the
CPU allocator is seen through so that such a free is recorded too (a row of size -1: "the block at this
address"), and given back at the end.
"""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import torch

from memprof.capture.kineto import SLOT_TAKEN, AllocationEvents
from memprof.capture.native.build import NativeBuildError, load
from memprof.errors import ProfilerError

_COLUMNS = 7  # time_ns, ptr, size, total_allocated, total_reserved, device_type, device_index
_CUDA_TYPE = 1  # c10::DeviceType::CUDA
_OTHER_DEVICE, _UNORDERED = 1, 2  # the reporter's drain flags (reporter.cpp)
_FEWEST_ROWS = 1024  # the smallest buffer a drain takes


def _capacity_for(rows: int) -> int:
    """Rows of the buffer the next drain takes, after one of ``rows``: a quarter more, to a power of two (an
    iteration's events repeat, so one call drains them; one that brings more takes a second)."""
    return max(_FEWEST_ROWS, 1 << (rows + rows // 4).bit_length())


class NativeAllocationStream:
    """Collects allocator events for one device between calls to :meth:`collect`, from the native reporter.

    Args:
        device: the device whose allocator is watched.

    Raises:
        NativeBuildError: the reporter library cannot be built or loaded.
    """

    source = "native"
    polls_in_backward = True  # reading the counter touches nothing of the autograd engine's

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.active = False
        self.watching_threads = False  # the CPU allocator seen through: frees on every thread recorded
        self._lib = load()
        self._handle = ctypes.c_void_p(self._lib.memprof_create())
        if not self._handle.value:
            raise NativeBuildError("the native reporter could not allocate its state")
        self._cuda = self.device.type == "cuda"
        self._net_at_collect = 0
        # what the reporter's drain says: its rows' flags, the rows left, the CPU's and CUDA's net bytes
        self._info = np.zeros(4, dtype=np.int64)
        self._info_ptr = self._info.ctypes.data
        self._capacity = _FEWEST_ROWS
        self._zeros = np.zeros(0, dtype=np.int64)  # a CPU's reserved bytes (read-only views of it)

    def start(self) -> None:
        """Installs the reporter in this thread's profiler slot.

        Raises:
            ProfilerError: the slot is taken (a torch.profiler session or another memprof is running).
        """
        code = self._lib.memprof_push(self._handle)
        if code == 1:
            raise ProfilerError(SLOT_TAKEN)
        if code != 0:
            raise ProfilerError("memprof's native reporter could not be installed in the profiler slot")
        self.active = True
        # frees on other threads (a communication library's, a pinning thread's) reach no slot of ours otherwise
        self.watching_threads = not self._cuda and self._lib.memprof_watch_threads(self._handle) == 0

    def net_bytes(self) -> int:
        """Net bytes this device allocated since the last :meth:`collect` (no copy, safe inside backward)."""
        return int(self._lib.memprof_net_bytes(self._handle, int(self._cuda))) - self._net_at_collect

    def collect(self, restart: bool = True) -> AllocationEvents:
        """Returns the events recorded since the last call; with ``restart=False`` also uninstalls the reporter."""
        if self.active and not restart:
            self._stop()
        columns, flags = self._drain()
        self._net_at_collect = int(self._info[3 if self._cuda else 2])
        return self._select(columns, flags)

    def close(self) -> AllocationEvents:
        """Stops recording and returns the last events."""
        return self.collect(restart=False)

    def _drain(self) -> tuple[np.ndarray, int]:
        """Copies the reporter's buffer of events out: its columns (one contiguous row each), and its flags; in one
        call to the reporter where they fit the buffer sized by the last drain."""
        capacity, count, flags = self._capacity, 0, 0
        columns = np.empty((_COLUMNS, capacity), dtype=np.int64)
        while True:
            start = count
            count += int(self._lib.memprof_drain(self._handle, columns.ctypes.data + 8 * start, capacity,
                                                 capacity - start, self._info_ptr))
            flags |= int(self._info[0])
            if start and count > start and columns[0, start] < columns[0, start - 1]:
                flags |= _UNORDERED  # (each drain looks at the order of its own rows only)
            left = int(self._info[1])
            if not left:
                break
            capacity = _capacity_for(count + left)  # more than it holds: the rows so far move to a bigger one
            bigger = np.empty((_COLUMNS, capacity), dtype=np.int64)
            bigger[:, :count] = columns[:, :count]
            columns = bigger
        self._capacity = _capacity_for(count)
        return columns[:, :count], flags

    @property
    def foreign_frees(self) -> int:
        """How many frees made on threads other than the recording one were recorded so far."""
        return int(self._lib.memprof_foreign_frees(self._handle))

    def _stop(self) -> None:
        self._lib.memprof_unwatch_threads(self._handle)
        self.watching_threads = False
        code = self._lib.memprof_pop(self._handle)
        self.active = False
        if code == 1:
            warnings.warn("memprof's reporter was not on top of this thread's profiler slot at close (was "
                          "close() called from another thread?); it stays installed there until that thread "
                          "ends", RuntimeWarning, stacklevel=4)

    def _select(self, columns: np.ndarray, flags: int) -> AllocationEvents:
        # Runs in record_stats() on the training thread. The common case, CPU events only and already in time
        # order (the reporter's flags say so), looks at no row: the columns are the reporter's own.
        if not self._cuda and not flags:
            return AllocationEvents(columns[0], columns[1], columns[2], columns[3], self._zero_column(columns.shape[1]))
        rows = columns.T
        if self._cuda:
            is_cuda = rows[:, 5] == _CUDA_TYPE
            own_index = np.maximum(rows[:, 6], 0) == (self.device.index or 0)  # -1 is "the current device"
            rows = rows[is_cuda & own_index]
        elif flags & _OTHER_DEVICE:
            rows = rows[rows[:, 5] != _CUDA_TYPE]
        if flags & _UNORDERED:
            rows = rows[np.argsort(rows[:, 0], kind="stable")]  # threads may append a little out of order
        reserved = rows[:, 4] if self._cuda else self._zero_column(len(rows))
        return AllocationEvents(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], reserved)

    def _zero_column(self, rows: int) -> np.ndarray:
        """``rows`` zeros, shared by the iterations (read-only: a zeroed column per step cost microseconds)."""
        if len(self._zeros) < rows:
            self._zeros = np.zeros(_capacity_for(rows), dtype=np.int64)
            self._zeros.flags.writeable = False
        return self._zeros[:rows]

    def __del__(self) -> None:
        lib, handle = getattr(self, "_lib", None), getattr(self, "_handle", None)
        if lib is None or handle is None or not handle.value:
            return
        if self.active:  # dropped without close(): take the reporter out of the slot if it is ours here
            lib.memprof_pop(handle)
        lib.memprof_destroy(handle)
        handle.value = None
