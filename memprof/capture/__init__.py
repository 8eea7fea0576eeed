"""Capture: what runs in the training process (torch).

The profiler attaches hooks (:mod:`~memprof.capture.hooks`), reads the allocator's events through a
stream (:mod:`~memprof.capture.streams`: the native reporter in :mod:`~memprof.capture.native`, or
torch.profiler in :mod:`~memprof.capture.kineto`) and hands each iteration's raw record
(:class:`memprof.analysis.records.IterationRecord`) to a sink (:mod:`~memprof.capture.sinks`): analysed
inline, or journaled for the background worker.

Public names load on first use (they import torch).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.capture.hooks import HookRecorder
    from memprof.capture.profiler import MemoryProfiler
    from memprof.capture.streams import AllocationStream, open_stream

_LAZY = {
    "AllocationStream": "memprof.capture.streams",
    "HookRecorder": "memprof.capture.hooks",
    "MemoryProfiler": "memprof.capture.profiler",
    "open_stream": "memprof.capture.streams",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AllocationStream",
    "HookRecorder",
    "MemoryProfiler",
    "open_stream",
]
