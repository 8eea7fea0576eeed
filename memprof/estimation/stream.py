"""Allocator events for fake tensors: what the allocator would report if the step ran for real.

:class:`FakeAllocationStream` has the interface of the profiler's allocator streams
(:mod:`memprof.capture.streams`: ``start``, ``net_bytes``, ``collect``, ``close``), so a
:class:`~memprof.capture.profiler.MemoryProfiler` reads it as it reads the allocator, and the trace of an
estimate is made by the same analysis as a measured one. Its events come from a ``TorchDispatchMode``
above ``FakeTensorMode``, which sees every operator's outputs:

* an output whose storage is none of the operator's inputs' (not a view, not in place) and was not seen
  before is a new storage: an allocation of its bytes (on CPU the allocator reports a storage's exact
  bytes; on CUDA the block :class:`~memprof.estimation.cuda_allocator.CachingAllocatorModel` gives it);
  empty storages are not reported, as neither allocator reports them;
* a weak reference to the storage reports its free when the last tensor using it dies, as the
  allocator's free would be.

Storages are named by :func:`memprof.capture.tensor_walk.storage_address`, switched to fake addresses while
the stream runs, so the hooks' addresses and the stream's agree. The running totals of the events are not
reported (``-1``): the analysis sums the blocks, as it does on CPU. What the stream cannot see: memory a
kernel allocates and frees inside one operator (workspaces, temporary copies), which fake tensors never
run, except for the kernels :mod:`memprof.estimation.workspace` probes on CPU; scalars the argument parser
wraps into tensors (8 bytes each).
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode

from memprof.analysis.records import AllocationEvents
from memprof.capture.hooks import now_ns
from memprof.capture.tensor_walk import fake_addresses, storage_address, tensors
from memprof.errors import EstimateError
from memprof.estimation.clock import VirtualClock
from memprof.estimation.cuda_allocator import CachingAllocatorModel
from memprof.estimation.workspace import WorkspaceProbe

__all__ = ["FakeAllocationStream"]

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
# How PyTorch says an operator has no fake or meta kernel (custom operators without register_fake).
_NO_FAKE = re.compile(r"no fake impl|'Meta' backend|meta kernel", re.IGNORECASE)
_UNKNOWN = -1  # running totals are not reported
_WORKSPACE_ADDRESS = 1  # odd: never a StorageImpl's address


# Frames in these folders are not the user's: the innermost frame outside them is where the user called.
_LIBRARIES = tuple(os.path.dirname(os.path.abspath(path)) + os.sep
                   for path in (torch.__file__ or "", os.path.dirname(os.path.abspath(__file__)), contextlib.__file__))


def _user_frame() -> str:
    """Where the user's code called the failing operator: the innermost frame outside torch and memprof."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_LIBRARIES):
            return f" (called at {frame.filename}:{frame.lineno}, in {frame.name})"
    return ""


#: The operator that reading a tensor into Python becomes, said in the user's terms.
_READS = {"aten._local_scalar_dense.default": " (a tensor read into Python: .item(), .tolist(), int(), an if)"}


def data_dependent_error(op: str) -> EstimateError:
    """The error an operator whose output depends on tensor values raises in an estimate."""
    return EstimateError(
        f"cannot estimate this step: {op}{_READS.get(op, '')} needs the values of its inputs{_user_frame()}, "
        "and an estimate runs on fake tensors that have shapes but no values (an output shape set by the "
        "data, or a tensor read into Python with .item(), .tolist() or an if). Make the shape static (e.g. "
        "multiply by a mask instead of indexing with it, keep counts as tensors), or measure a real step "
        "with MemoryProfiler", op=op)


class _Operators(TorchDispatchMode):
    """Calls each operator and hands it, its arguments and its outputs to ``ran``."""

    def __init__(self, ran: Callable[[Any, tuple, dict, Any], None], failed: Callable[[EstimateError], None]) -> None:
        super().__init__()
        self._ran = ran
        self._failed = failed

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except _DATA_DEPENDENT as exc:
            error = data_dependent_error(str(getattr(exc, "func", func)))
            self._failed(error)
            raise error from None
        except (UnsupportedOperatorException, RuntimeError, NotImplementedError) as exc:
            if not isinstance(exc, UnsupportedOperatorException) and not _NO_FAKE.search(str(exc)):
                raise  # the user's error (a shape mismatch, ...), as the real step would raise it
            error = EstimateError(f"cannot estimate this step: {func}{_user_frame()} has no fake-tensor "
                                  "(meta) implementation; register one (torch.library.register_fake) or "
                                  "measure a real step with MemoryProfiler", op=str(func))
            self._failed(error)
            raise error from None
        self._ran(func, args, kwargs, out)
        return out


class FakeAllocationStream:
    """Allocation and free events of fake tensors' storages, for a :class:`MemoryProfiler`.

    Args:
        device: the device whose allocator is modelled (``cpu``: exact storage bytes; ``cuda``: the
            caching allocator's blocks, and its reserved bytes).
        probe: measures the workspace of CPU kernels (:mod:`memprof.estimation.workspace`); ``None``: none
            is reported (the CPU's kernels' workspace says nothing of CUDA's).
        clock: advanced past each operator (:class:`~memprof.estimation.clock.VirtualClock`); the events are
            stamped with the hooks' clock (:func:`memprof.capture.hooks.now_ns`), which should be it.
    """

    #: Names the source in the trace's metadata.
    source = "fake-tensors"
    #: Whether :meth:`net_bytes` may be called inside autograd's backward.
    polls_in_backward = True

    def __init__(self, device: torch.device | str, probe: WorkspaceProbe | None = None,
                 clock: VirtualClock | None = None) -> None:
        self.device = torch.device(device)
        self.active = False
        #: The first operator that could not run on fake tensors (kept should the user's code catch it).
        self.failure: EstimateError | None = None
        self._cuda = self.device.type == "cuda"
        self._allocator = CachingAllocatorModel() if self._cuda else None
        self._probe, self._clock = probe, clock
        self._mode = _Operators(self._operator, self._note_failure)
        self._addresses = fake_addresses()
        self._rows: list[tuple[int, int, int, int, int]] = []
        self._live: dict[int, tuple[Any, int, int]] = {}  # storage address -> (weak ref, bytes, model address)
        self._net_bytes = 0

    # ------------------------------------------------------------------ the stream's interface
    def start(self) -> None:
        """Starts seeing operators (pushes the dispatch mode; fake tensors named by fake addresses)."""
        self._addresses.__enter__()
        self._mode.__enter__()
        self.active = True

    def net_bytes(self) -> int:
        """Net bytes allocated since the last :meth:`collect`."""
        return self._net_bytes

    def collect(self, restart: bool = True) -> AllocationEvents:
        """Returns the events since the last call; with ``restart=False`` also stops seeing operators."""
        if self.active and not restart:
            self._mode.__exit__(None, None, None)
            self._addresses.__exit__(None, None, None)
            self.active = False
        rows, self._rows = self._rows, []
        self._net_bytes = 0
        if not rows:
            return AllocationEvents.empty()
        array = np.array(rows, dtype=np.int64)
        array = array[np.argsort(array[:, 0], kind="stable")]
        return AllocationEvents(*(np.ascontiguousarray(array[:, i]) for i in range(5)))

    def close(self) -> AllocationEvents:
        """Stops seeing operators and returns the last events."""
        return self.collect(restart=False)

    def reserved_bytes(self) -> int:
        """The modelled allocator's reserved bytes now (0 on CPU, which caches nothing)."""
        return self._allocator.reserved_bytes if self._allocator is not None else 0

    # ------------------------------------------------------------------ storages
    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Takes storages that exist before the stream starts (model state): their frees are reported, and
        on CUDA the modelled allocator holds them, in this order, as if they had been allocated first."""
        for tensor in tensors:
            self._track(tensor.untyped_storage(), report=False)

    def _operator(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """One operator ran: its new storages are allocated, then it takes its time, then its workspace
        (the kernel's own buffers, alive while its outputs are made) is freed."""
        workspace_bytes = self._probe.workspace_bytes(func, args, kwargs) if self._probe is not None else 0
        seen = {storage_address(t.untyped_storage()) for t in tensors((args, kwargs))}
        if workspace_bytes:
            self._report(_WORKSPACE_ADDRESS, workspace_bytes)
        for tensor in tensors(out):
            storage = tensor.untyped_storage()
            if storage_address(storage) not in seen:
                self._track(storage, report=True)
        if self._clock is not None:
            self._clock.advance(func, args, kwargs, out)
        if workspace_bytes:
            self._report(_WORKSPACE_ADDRESS, -workspace_bytes)

    def _report(self, address: int, size: int) -> None:
        self._rows.append((now_ns(), address, size, _UNKNOWN, self.reserved_bytes()))
        self._net_bytes += size

    def _track(self, storage: torch.UntypedStorage, report: bool) -> None:
        address = storage_address(storage)
        nbytes = int(storage.nbytes())
        if address in self._live or nbytes == 0:
            return
        size, model_address = nbytes, 0
        if self._allocator is not None:
            model_address, size = self._allocator.malloc(nbytes)
        self._live[address] = (weakref.ref(storage, self._freer(address)), size, model_address)
        if report:
            self._report(address, size)

    def _freer(self, address: int) -> Callable[[Any], None]:
        def freed(_ref: Any) -> None:
            entry = self._live.pop(address, None)
            if entry is None:
                return
            _, size, model_address = entry
            if self._allocator is not None:
                self._allocator.free(model_address)
            self._report(address, -size)
        return freed

    def _note_failure(self, error: EstimateError) -> None:
        if self.failure is None:
            self.failure = error
