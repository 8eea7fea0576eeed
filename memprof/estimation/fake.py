"""Turning a model, its batch and its optimizer into fake tensors, without allocating their memory.

A model's parameters and buffers may be real tensors (on any device) or meta tensors (a model built under
``torch.device("meta")``); either way each becomes a fake tensor of the same shape, strides and dtype on
the modelled device, and tensors that share a storage (tied weights) share one fake storage of the same
bytes. The model is changed in place for the estimate and given its own tensors back afterwards
(:func:`fake_state`), so a real model is left as it was and no copy of its weights is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from memprof.errors import EstimateError

__all__ = ["FakeConverter", "fake_state"]


class FakeConverter:
    """Makes fake twins of tensors on one device, one fake storage per real (or meta) storage.

    Args:
        mode: the fake tensor mode the twins belong to.
        device: where the twins live (``cpu`` or ``cuda``; no memory is allocated there).
    """

    def __init__(self, mode: FakeTensorMode, device: torch.device) -> None:
        self.mode = mode
        self.device = device
        self._bases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # storage key -> (original, fake bytes)

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The fake twin of ``tensor`` (itself when it is already one of this mode's fake tensors)."""
        if isinstance(tensor, FakeTensor) and tensor.fake_mode is self.mode:
            return tensor
        if tensor.layout != torch.strided:
            raise EstimateError(f"cannot estimate a model with a {tensor.layout} tensor: only dense (strided) "
                                "tensors have fake twins; make it dense or measure a real step instead")
        storage = tensor.untyped_storage()
        key = int(storage._cdata)  # unique while the storage lives, for real and meta storages alike
        with self.mode:
            found = self._bases.get(key)
            if found is None:
                found = (tensor, torch.empty(storage.nbytes(), dtype=torch.uint8, device=self.device))
                self._bases[key] = found  # the original is kept so that its storage's address stays its own
            base = found[1]
            if tensor.element_size() > 1:
                base = base[: storage.nbytes() - storage.nbytes() % tensor.element_size()].view(tensor.dtype)
            elif tensor.dtype != torch.uint8:
                base = base.view(tensor.dtype)
            return base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())

    def structure(self, obj: Any, depth: int = 0) -> Any:
        """A batch with every tensor made fake (``torch.Size`` leaves become fake tensors of that shape in
        the default dtype); tuples, lists and dicts are rebuilt, other values kept."""
        if isinstance(obj, torch.Size):
            with self.mode:
                return torch.empty(obj, device=self.device)
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if depth > 8:
            return obj
        if isinstance(obj, dict):
            return type(obj)((k, self.structure(v, depth + 1)) for k, v in obj.items())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
            return type(obj)(*(self.structure(v, depth + 1) for v in obj))
        if isinstance(obj, (tuple, list)):
            return type(obj)(self.structure(v, depth + 1) for v in obj)
        return obj


@contextlib.contextmanager
def fake_state(model: nn.Module, converter: FakeConverter) -> Iterator[list[torch.Tensor]]:
    """Replaces the model's parameters and buffers by fake twins for the ``with`` block, then puts the
    originals back; yields the fake tensors, parameters first, each once, in the model's order."""
    saved: list[tuple[dict[str, Any], str, Any]] = []  # (the module's table, name, original)
    twins: dict[int, Any] = {}
    try:
        for module in model.modules():
            tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
            for table in tables:
                for name, value in list(table.items()):
                    if value is None:
                        continue
                    twin = twins.get(id(value))
                    if twin is None:
                        twin = converter.tensor(value.detach())
                        if isinstance(value, nn.Parameter):
                            twin = nn.Parameter(twin, requires_grad=value.requires_grad)
                        twins[id(value)] = twin
                    saved.append((table, name, value))
                    table[name] = twin
        params = [t for t in twins.values() if isinstance(t, nn.Parameter)]
        yield params + [t for t in twins.values() if not isinstance(t, nn.Parameter)]
    finally:
        for table, name, value in reversed(saved):
            table[name] = value
