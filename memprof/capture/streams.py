"""The allocator's own record of every allocation and free, and the choice between its two readers.

PyTorch reports each allocation and free of its CPU and CUDA allocators to whatever sits in its
profiler slot, with the block's address, its size and the allocator's running totals. Two streams read
that report and give the same events (the tests compare them):

* :class:`memprof.capture.native.stream.NativeAllocationStream`, the default: a small C++ reporter in
  the slot that only buffers the events (built by :mod:`memprof.capture.native.build`);
* :class:`memprof.capture.kineto.KinetoAllocationStream`, the fallback where the reporter cannot be
  built: PyTorch's own profiler with ``profile_memory`` and no operator events, stopped and restarted
  at every ``record_stats()``, which costs a few milliseconds per step.
"""

from __future__ import annotations

import warnings

import torch

from memprof.capture.kineto import KinetoAllocationStream
from memprof.capture.native.build import NativeBuildError
from memprof.capture.native.stream import NativeAllocationStream

__all__ = ["AllocationStream", "open_stream"]

AllocationStream = NativeAllocationStream | KinetoAllocationStream
_warned = False


def open_stream(device: torch.device) -> AllocationStream:
    """The native stream where the reporter builds, else torch.profiler's (warned once per process)."""
    global _warned
    try:
        return NativeAllocationStream(device)
    except NativeBuildError as exc:
        if not _warned and "switched off" not in str(exc):
            _warned = True
            warnings.warn(f"memprof's native allocator reporter is unavailable ({exc}); reading allocator "
                          "events through torch.profiler instead, which costs a few ms more per step",
                          RuntimeWarning, stacklevel=3)
        return KinetoAllocationStream(device)
