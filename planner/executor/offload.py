"""Saved activations to host memory and back: the executor's ``OFFLOAD`` and ``PREFETCH`` operations.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it in
the files it writes). A stage the schedule offloads runs its recorded forward (``F_all``) under
``torch.autograd.graph.saved_tensors_hooks``: the pack hook notes each tensor autograd saves, grouped by
storage (views of one storage travel once and come back as views of one storage), and leaves it where it is.
``OFFLOAD(l)`` then copies each noted storage to a host buffer -- except storages the stage does not own:
its input and output (the schedule keeps them), its parameters and buffers, its side inputs -- and those
under ``min_bytes`` (small tensors are not worth a copy). When the copy is retired (see
:mod:`planner.simulation.streams`: the next ``OFFLOAD``, a ``B``, the end of the chain's forward) the device tensors
are dropped, so their memory is freed. ``PREFETCH(l)`` copies them back into fresh device memory; when it
is retired the host buffers go back to the pool, and the unpack hook rebuilds each saved tensor (dtype,
size, stride, offset) over the copy when autograd asks for it in ``B(l)``.

On CUDA the host buffers are pinned and the copies run on two side streams (one each way), ordered by
events: an offload waits for the forward that produced its tensors, the compute stream waits for a
prefetch before ``B(l)``. Pinning is slow, so buffers come from a pool kept by the executor and reused
across steps. Without CUDA the same path copies host to host, synchronously, which is what the CPU tests
check (bitwise gradients, every buffer returned, the memory freed).
"""

from __future__ import annotations

from typing import Any

import torch

MIN_OFFLOAD_BYTES = 4096
"""Storages smaller than this stay on the device (a copy's fixed cost would outweigh the memory)."""


class HostPool:
    """Host buffers (``uint8``, pinned for CUDA), reused by size across steps.

    Attributes:
        created: buffers allocated so far (each one pinned once).
        outstanding: buffers taken and not yet given back.
    """

    def __init__(self) -> None:
        self.free: dict[tuple[int, bool], list[tuple[torch.Tensor, Any]]] = {}
        self.created = 0
        self.outstanding = 0

    def take(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """A buffer of ``nbytes`` bytes, from the pool when one is free."""
        self.outstanding += 1
        stack = self.free.get((nbytes, pinned))
        if stack:
            buffer, ready = stack.pop()
            if ready is not None:
                ready.synchronize()  # the copy that last read it has finished
            return buffer
        self.created += 1
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def give(self, buffer: torch.Tensor, ready: Any = None) -> None:
        """Returns ``buffer``; ``ready`` is an event after which no copy reads it any more (``None``: now)."""
        self.outstanding -= 1
        self.free.setdefault((buffer.numel(), buffer.is_pinned()), []).append((buffer, ready))


class Copier:
    """The side streams of one CUDA device (``None`` streams on CPU, where copies are synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.d2h = torch.cuda.Stream(device) if self.cuda else None
        self.h2d = torch.cuda.Stream(device) if self.cuda else None


class _Storage:
    """One storage on its way out and back: the device tensor that holds it, its host copy, the copy back."""

    __slots__ = ("source", "host", "back", "nbytes", "out_done", "back_done", "packed")

    def __init__(self, source: torch.Tensor) -> None:
        self.source: torch.Tensor | None = source
        self.host: torch.Tensor | None = None
        self.back: torch.Tensor | None = None
        self.nbytes = source.untyped_storage().nbytes()
        self.out_done: Any = None
        self.back_done: Any = None
        self.packed: list[_Packed] = []


class _Packed:
    """What autograd keeps of a saved tensor: the tensor until it leaves, then where to rebuild it from."""

    __slots__ = ("tensor", "storage", "dtype", "size", "stride", "offset", "version")

    def __init__(self, tensor: torch.Tensor, storage: _Storage) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.storage = storage
        self.dtype, self.size, self.stride = tensor.dtype, tensor.size(), tensor.stride()
        self.offset, self.version = tensor.storage_offset(), tensor._version


def storage_key(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage (views of one storage share it; 0 for an empty one)."""
    return tensor.untyped_storage().data_ptr()


class Stash:
    """The saved tensors of one recorded stage, and their trip to host memory and back.

    Args:
        pool: the executor's host buffers.
        copier: the device's side streams.
        device: the stage's device (tensors elsewhere stay put).
        min_bytes: storages below this size stay on the device.
        kept: storage addresses that must not move (parameters, buffers, side inputs, the stage's input).
    """

    def __init__(self, pool: HostPool, copier: Copier, device: torch.device, min_bytes: int, kept: set[int]) -> None:
        self.pool, self.copier, self.device, self.min_bytes = pool, copier, device, min_bytes
        self.kept = set(kept)
        self.storages: dict[int, _Storage] = {}
        self.moved: list[_Storage] = []

    def keep(self, tensors: Any) -> None:
        """Marks more storages as not to move (the stage's outputs, once it has run)."""
        self.kept.update(storage_key(t) for t in tensors)

    def pack(self, tensor: torch.Tensor) -> Any:
        """The pack hook: notes ``tensor`` (grouped by storage) or, when it cannot move, returns it as is."""
        if tensor.device != self.device or tensor.layout != torch.strided or tensor.is_sparse:
            return tensor
        try:
            key = storage_key(tensor)
        except (RuntimeError, NotImplementedError):  # no storage (a functional or fake tensor)
            return tensor
        if key == 0 or key in self.kept:
            return tensor
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(tensor)
        packed = _Packed(tensor, storage)
        storage.packed.append(packed)
        return packed

    def unpack(self, packed: Any) -> torch.Tensor:
        """The unpack hook: the saved tensor, rebuilt over its prefetched copy when it went to the host."""
        if not isinstance(packed, _Packed):
            return packed
        if packed.tensor is not None:
            return packed.tensor
        storage = packed.storage
        if storage.back is None:  # not prefetched (a schedule without PREFETCH): fetch on demand
            self.prefetch()
        self.arrive()
        back = storage.back
        assert back is not None
        return torch.empty(0, dtype=packed.dtype, device=back.device).set_(
            back.untyped_storage(), packed.offset, packed.size, packed.stride)

    def offload(self) -> None:
        """Starts copying every movable storage to host buffers (``OFFLOAD``); the device keeps them for now."""
        pinned = self.copier.cuda
        if self.copier.d2h is not None:  # the copies start once the forward that made the tensors has run
            self.copier.d2h.wait_stream(torch.cuda.current_stream(self.device))
        for key, storage in self.storages.items():
            if key in self.kept or storage.nbytes < self.min_bytes or storage.source is None:
                # stays: only autograd's packed records hold it now (no cycle through this record), so it is
                # freed as the backward uses it, as in plain autograd
                storage.source, storage.packed = None, []
                continue
            for packed in storage.packed:
                if packed.tensor is not None and packed.tensor._version != packed.version:
                    raise RuntimeError(
                        "a tensor saved for backward was modified in place after it was saved (its version moved "
                        f"from {packed.version} to {packed.tensor._version}); it cannot be offloaded"
                    )
            host = self.pool.take(storage.nbytes, pinned)
            raw = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage.source.untyped_storage())
            storage.host = host
            if self.copier.cuda:
                assert self.copier.d2h is not None
                with torch.cuda.stream(self.copier.d2h):
                    host.copy_(raw, non_blocking=True)
                    storage.out_done = torch.cuda.Event()
                    storage.out_done.record()
            else:
                host.copy_(raw)
            self.moved.append(storage)

    def release(self) -> None:
        """Retires the offload: waits for its copies, then drops the device tensors (their memory is freed)."""
        for storage in self.moved:
            if storage.out_done is not None:
                storage.out_done.synchronize()
                storage.out_done = None
            storage.source = None
            for packed in storage.packed:
                packed.tensor = None
            storage.packed = []  # autograd's packed records hold the storage record, not the other way round

    def prefetch(self) -> None:
        """Starts copying the host buffers back into fresh device memory (``PREFETCH``)."""
        for storage in self.moved:
            if storage.back is not None or storage.host is None:
                continue
            if self.copier.cuda:
                assert self.copier.h2d is not None
                with torch.cuda.stream(self.copier.h2d):
                    back = torch.empty(storage.nbytes, dtype=torch.uint8, device=self.device)
                    back.copy_(storage.host, non_blocking=True)
                    storage.back_done = torch.cuda.Event()
                    storage.back_done.record()
            else:
                back = torch.empty(storage.nbytes, dtype=torch.uint8)
                back.copy_(storage.host)
            storage.back = back

    def arrive(self) -> None:
        """Retires the prefetch: the compute stream waits for the copies; the host buffers go back to the pool."""
        for storage in self.moved:
            if storage.host is None or storage.back is None:
                continue
            if storage.back_done is not None:
                torch.cuda.current_stream(self.device).wait_event(storage.back_done)
                storage.back.record_stream(torch.cuda.current_stream(self.device))  # made on the side stream
            self.pool.give(storage.host, storage.back_done)
            storage.host, storage.back_done = None, None
        # From now on only autograd's packed records reach the copies, so each is freed once the backward has
        # used every saved tensor over it, as plain autograd frees saved tensors.
        self.moved, self.storages = [], {}

    def discard(self) -> None:
        """Gives back any host buffer still held (the stage's backward has run, or the step was abandoned)."""
        for storage in self.moved:
            if storage.host is not None:
                if storage.out_done is not None:
                    storage.out_done.synchronize()
                self.pool.give(storage.host, storage.back_done)
                storage.host = None
        self.moved, self.storages = [], {}

    @property
    def moved_bytes(self) -> int:
        """Bytes of the storages this stage sent to host memory."""
        return sum(storage.nbytes for storage in self.moved)
