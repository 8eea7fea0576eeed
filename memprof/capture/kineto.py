"""torch.profiler's allocator events: the fallback stream where the native reporter cannot be built.

PyTorch's own profiler with ``profile_memory`` and no operator events (``RecordScope.USER_SCOPE``),
collected at every ``record_stats()`` by stopping and immediately restarting the session, which costs
a few milliseconds per step. The choice between the streams is :mod:`memprof.capture.streams`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch

from memprof.analysis.records import AllocationEvents
from memprof.errors import ProfilerError

__all__ = ["SLOT_TAKEN", "AllocationEvents", "KinetoAllocationStream"]

#: Why memprof cannot start: torch.profiler (or another memprof) holds this thread's profiler slot.
SLOT_TAKEN = ("another torch.profiler session is active; memprof reads the allocator through the same mechanism "
              "and cannot run beside it. Stop the other profiler, or attach MemoryProfiler outside its context")


def _concat(batches: list[AllocationEvents]) -> AllocationEvents:
    batches = [b for b in batches if len(b)]
    if not batches:
        return AllocationEvents.empty()
    if len(batches) == 1:
        return batches[0]
    fields = ("time_ns", "ptr", "size_bytes", "total_allocated_bytes", "total_reserved_bytes")
    return AllocationEvents(*(np.concatenate([getattr(b, f) for b in batches]) for f in fields))


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    # Kineto prints two log lines to the C-level stderr on every start/stop; no setting turns them
    # off, and record_stats() restarts the session every iteration.
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class KinetoAllocationStream:
    """Collects allocator events for one device between calls to :meth:`collect`, through torch.profiler.

    Args:
        device: the device whose allocator is watched.
    """

    #: Names the source in the trace's metadata.
    source = "torch.profiler"
    #: Whether :meth:`net_bytes` may be called inside autograd's backward (it may not: it restarts the session).
    polls_in_backward = False

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.active = False
        self._pending: list[AllocationEvents] = []

    @staticmethod
    def _config() -> tuple:
        from torch._C._profiler import ProfilerActivity, RecordScope, _ExperimentalConfig
        from torch.autograd import ProfilerConfig, ProfilerState

        config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
        # CPU activity alone: the allocators (CPU and CUDA) report to the profiler's memory hook
        # either way, and CUPTI kernel tracing would only add cost.
        return config, {ProfilerActivity.CPU}, {RecordScope.USER_SCOPE}

    def start(self) -> None:
        """Starts recording.

        Raises:
            ProfilerError: another ``torch.profiler`` session is running in this thread.
        """
        from torch.autograd import _enable_profiler, _prepare_profiler, _profiler_enabled

        if _profiler_enabled():
            raise ProfilerError(SLOT_TAKEN)
        config, activities, scopes = self._config()
        older = torch.empty(1)  # allocated before profiling: c10 does not know its size
        with _native_stderr_silenced():
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities, scopes)  # type: ignore[call-arg]  # the stub lacks `scopes`
            # c10's CPU allocator logs "Memory block of unknown size was allocated before the profiling started"
            # at the first free, while memory is profiled, of a block it did not see allocated, then at every
            # 1000th (a count per process). memprof expects those frees (it watches old storages with finalizers):
            # this one, into /dev/null, takes the first line, and one more at each restart. No event is recorded
            # for it (c10 reports no free of a size it does not know).
            del older
        self.active = True

    def _stop(self):  # -> torch.autograd._ProfilerResult
        from torch.autograd import _disable_profiler

        with _native_stderr_silenced():
            result = _disable_profiler()
        self.active = False
        return result

    def net_bytes(self) -> int:
        """Net bytes allocated since the last :meth:`collect` (the recorded events are kept for it).

        Used by the budget guard on CPU, where no allocator counter can be read directly. Each call
        stops and restarts the session (about 0.5 ms).
        """
        if self.active:
            events = self._extract(self._stop())
            self.start()
            self._pending.append(events)
        return int(sum(int(batch.size_bytes.sum()) for batch in self._pending))

    def collect(self, restart: bool = True) -> AllocationEvents:
        """Returns the events recorded since the last call, restarting the session unless told not to."""
        batches, self._pending = self._pending, []
        if self.active:
            result = self._stop()
            if restart:
                self.start()
            batches.append(self._extract(result))
        return _concat(batches)

    def close(self) -> AllocationEvents:
        """Stops recording and returns the last events."""
        return self.collect(restart=False)

    def _extract(self, result) -> AllocationEvents:
        # This walk runs for every allocation and free (~1,000 per step): attribute reads through
        # pybind dominate, so read only what is needed and keep the loop body minimal.
        want_cuda = self.device.type == "cuda"
        want_index = self.device.index if self.device.index is not None else 0
        check_device = want_cuda or torch.cuda.is_available()
        rows: list[tuple[int, ...]] = []
        append = rows.append
        stack = list(result.experimental_event_tree())
        while stack:
            node = stack.pop()
            if node.children:  # memory events nest under the user's own record_function scopes
                stack.extend(node.children)
            fields = node.extra_fields
            try:
                size = fields.alloc_size
            except AttributeError:
                continue  # an operator or annotation event, not the allocator's
            if check_device:
                device = fields.device
                if want_cuda != (device.type == "cuda") or (want_cuda and (device.index or 0) != want_index):
                    continue
                reserved = fields.total_reserved
            else:
                reserved = 0
            append((node.start_time_ns, fields.ptr, size, fields.total_allocated, reserved))
        if not rows:
            return AllocationEvents.empty()
        array = np.array(rows, dtype=np.int64)
        array = array[np.argsort(array[:, 0], kind="stable")]
        return AllocationEvents(*(np.ascontiguousarray(array[:, i]) for i in range(5)))
