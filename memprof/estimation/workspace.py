"""Memory a CPU kernel allocates and frees inside one operator (its workspace), measured on a small probe.

Fake tensors compute shapes; they never run kernels, so what a kernel allocates for itself and frees before
it returns is invisible to them. On CPU a few kernels allocate that much: oneDNN's convolutions copy their
input, weight and output into blocked layouts, batch and layer norm's backward keep an input-sized buffer,
the flash attention kernel keeps per-thread buffers. For the operators of :data:`PROBED` (the kernels seen
to do so in the estimate's test models) the estimate runs the real kernel once per distinct signature on
random data, reads the allocator's events around it, and takes its workspace: the highest bytes allocated
during the call above what it returns. The stream then reports a block of that size around the operator's
outputs, so the step's peak sees the kernel's.

A probe allocates real memory for the operator's arguments. When they would exceed :data:`PROBE_LIMIT_BYTES`,
the batch (dimension 0 of the arguments that carry it) is cut to 2 and 4 and the workspace extrapolated
linearly (the blocked copies grow with the batch; the weight's copy does not).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["PROBED", "PROBED_CUDA", "PROBE_LIMIT_BYTES", "WorkspaceProbe"]

_aten = torch.ops.aten
#: Operators whose CPU kernels allocate inside -> positions of the arguments whose dimension 0 is the batch.
PROBED: dict[Any, tuple[int, ...]] = {
    _aten.convolution.default: (0,),
    _aten.convolution_backward.default: (0, 1),
    _aten.native_batch_norm.default: (0,),
    _aten.native_batch_norm_backward.default: (0, 1),
    _aten.native_layer_norm_backward.default: (0, 1, 3, 4),
    _aten._scaled_dot_product_flash_attention_for_cpu.default: (0, 1, 2),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (0, 1, 2, 3, 4, 5),
}
#: On a machine with a GPU, a CUDA estimate runs CUDA's operators: the kernels whose workspace (cuDNN's, for a
#: convolution's algorithm) comes from the caching allocator inside the call -> as :data:`PROBED`.
PROBED_CUDA: dict[Any, tuple[int, ...]] = {
    _aten.convolution.default: (0,),
    _aten.convolution_backward.default: (0, 1),
}
#: Real bytes a probe may allocate for its arguments before it cuts the batch.
PROBE_LIMIT_BYTES = 64 << 20
#: The batches a cut probe runs at. Not 1: at batch 1 the CPU convolution takes another path (im2col).
_SMALL_BATCHES = (2, 4)

Signature = tuple[Any, ...]


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    return ("value", repr(value))


def _real(value: Any, batch: int | None, carries_batch: bool, device: torch.device) -> Any:
    """A real tensor on ``device`` standing in for a fake one (random floats, zero integers), its batch cut to
    ``batch``."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = list(value.shape)
    if batch is not None and carries_batch and shape:
        shape[0] = batch
    tensor = torch.empty(shape, dtype=value.dtype, device=device)
    if tensor.is_floating_point():
        tensor.normal_()
    else:
        tensor.zero_()
    return tensor


class WorkspaceProbe:
    """Measures, and remembers per signature, the workspace of the operators in :data:`PROBED`.

    Args:
        measure: runs a callable and returns the sizes of the allocator's events during it, in order
            (default: memprof's own allocator stream on the CPU; :func:`cuda_sizes` on a CUDA device).
        device: where the probes run (``cpu``, or a CUDA device for :data:`PROBED_CUDA`'s kernels).
    """

    def __init__(self, measure: Callable[[Callable[[], Any]], list[int]] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self._measure = measure or (functools.partial(cuda_sizes, device=self.device) if cuda else _allocator_sizes)
        self._probed = PROBED_CUDA if cuda else PROBED
        self._known: dict[Signature, int] = {}
        self.warned = False

    def workspace_bytes(self, func: Any, args: tuple, kwargs: dict) -> int:
        """The bytes ``func``'s kernel allocates inside the call (0 for operators not probed)."""
        positions = self._probed.get(func)
        if positions is None:
            return 0
        signature = (func, tuple(_describe(a) for a in args), tuple((k, _describe(v)) for k, v in kwargs.items()))
        found = self._known.get(signature)
        if found is None:
            found = self._known[signature] = self._probe(func, args, kwargs, positions)
        return found

    def _probe(self, func: Any, args: tuple, kwargs: dict, positions: tuple[int, ...]) -> int:
        if self.device.type == "cpu" and torch.autograd._profiler_enabled():  # the events go to the slot's holder
            if not self.warned:
                self.warned = True
                warnings.warn("a torch.profiler session is running, so memprof's estimate cannot measure the "
                              "workspace of CPU kernels (convolutions, norms); the estimate leaves it out",
                              RuntimeWarning, stacklevel=6)
            return 0
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        total = sum(t.numel() * t.element_size() for t in tensors)
        batch = args[positions[0]].shape[0] if args[positions[0]].dim() else 1
        if total <= PROBE_LIMIT_BYTES or batch <= _SMALL_BATCHES[1]:
            return self._run(func, args, kwargs, positions, None)
        low, high = _SMALL_BATCHES
        at_low, at_high = (self._run(func, args, kwargs, positions, n) for n in _SMALL_BATCHES)
        return max(0, at_low + (at_high - at_low) * (batch - low) // (high - low))

    def _run(self, func: Any, args: tuple, kwargs: dict, positions: tuple[int, ...], batch: int | None) -> int:
        with _disable_current_modes(), torch.no_grad():
            device = self.device
            real_args = tuple(_real(a, batch, i in positions, device) for i, a in enumerate(args))
            # a keyword tensor (an attention mask) carries the batch when it is 4-d with the batch's length
            first = args[positions[0]]
            real_kwargs = tree_map(lambda v: _real(v, batch, isinstance(v, torch.Tensor) and v.dim() == 4
                                                   and v.shape[0] == first.shape[0], device), kwargs)
            result: list[Any] = []
            sizes = self._measure(lambda: result.append(func(*real_args, **real_kwargs)))
        running = peak = 0
        for size in sizes:
            running += size
            peak = max(peak, running)
        return max(0, peak - running)


def _allocator_sizes(call: Callable[[], Any]) -> list[int]:
    """The sizes of the CPU allocator's events (+ allocations, - frees) during ``call()``, in order."""
    from memprof.capture.streams import open_stream

    stream = open_stream(torch.device("cpu"))
    stream.start()
    try:
        call()
    finally:
        events = stream.close()
    return [int(size) for size in events.size_bytes.tolist()]


def cuda_sizes(call: Callable[[], Any], device: torch.device | None = None) -> list[int]:
    """What the caching allocator held during ``call()`` on a CUDA device, as two events: up to its highest
    bytes, then down to what the call left allocated (the statistics give the peak, not each event).

    It resets the device's peak statistics (``torch.cuda.max_memory_allocated`` starts again from here).
    """
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    call()
    torch.cuda.synchronize(device)
    peak, after = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
    return [peak - before, after - peak]
