"""Noticing a key/value cache that a training step builds and never reads.

Hugging Face configs default to ``use_cache=True`` (``GPT2Config()``, ``LlamaConfig()``); a training
forward then fills a cache with every layer's keys and values and returns it (as ``cache`` in transformers 5,
``past_key_values`` before). The profiler counts that memory (it is allocated), but a user looking at the step
should know it is there and that it is not needed: one :class:`KeyValueCacheWarning`, with its size, the first
time a training forward returns one.

The output is read without its deprecated names: transformers 5 logs "`past_key_values`/`cache_params` are
deprecated" for every ``output.past_key_values`` or ``output.get("past_key_values")``, so the fields are
looked up by iterating the output's items, which no version renames. Storages are told apart by their
``StorageImpl`` (``_cdata``), not by ``data_ptr()``: a fake tensor's (``memprof.estimate``) data pointer is 0
for every storage, and asking for it makes torch warn that it is deprecated.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memprof.units import format_bytes

__all__ = ["CacheWatcher", "KeyValueCacheWarning", "cache_bytes"]

_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
_MAX_DEPTH = 4  # a cache object holds its tensors a few attributes deep (cache.layers[i].keys)
#: The field of a model's output that holds its cache: transformers 4 names it past_key_values, 5 cache.
_OLD_NAME, _NEW_NAME = "past_key_values", "cache"


class KeyValueCacheWarning(UserWarning):
    """A training forward returned a key/value cache it never reads (its own category, so that a caller that
    runs many steps of the same model, e.g. ``memprof estimate --max-batch``, can say it once)."""


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (nn.Module, type)):
        for item in vars(obj).values():
            yield from _tensors(item, depth + 1)


def cache_bytes(output: Any) -> tuple[str, int] | None:
    """The class name and storage bytes of the key/value cache a model returned (``cache`` in transformers 5,
    ``past_key_values`` before), if it returned one.

    Args:
        output: what the model's forward returned (a ``ModelOutput``, a dict or anything else).

    Returns:
        ``(class name, bytes)`` of a non-empty cache, else ``None``.
    """
    cache = _returned_cache(output)
    if cache is None:
        return None
    seen: dict[int, int] = {}
    for tensor in _tensors(cache):
        storage = tensor.untyped_storage()
        seen[int(storage._cdata)] = storage.nbytes()  # the StorageImpl: one per storage, real or fake
    total = sum(seen.values())
    return (type(cache).__name__, total) if total else None


def _returned_cache(output: Any) -> Any:
    """The cache in a model's output: ``past_key_values`` (transformers 4, or any dict or object), or ``cache``
    when it holds a transformers ``Cache``; ``None`` when there is none."""
    if isinstance(output, dict):  # a ModelOutput is a dict; its items() use the fields' own names
        fields = dict(output.items())
        cache = fields.get(_OLD_NAME)
        if cache is None and _is_cache(fields.get(_NEW_NAME)):
            cache = fields[_NEW_NAME]
        return cache
    return getattr(output, _OLD_NAME, None)


def _is_cache(obj: Any) -> bool:
    """Whether ``obj`` is a transformers ``Cache`` (``DynamicCache``, ``StaticCache`` ...), by its class's bases:
    a field named ``cache`` in some other model's output is not taken for one."""
    return obj is not None and any(base.__name__ == "Cache" for base in type(obj).__mro__)


class CacheWatcher:
    """Warns once when a training forward of ``model`` returns a key/value cache, saying how large it is.

    Args:
        model: the profiled model (its root module's output is checked).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handle: RemovableHandle | None = model.register_forward_hook(self._check)

    def _check(self, module: nn.Module, args: Any, output: Any) -> None:
        if _compiling() or not (module.training and torch.is_grad_enabled()):  # traced: nothing to look at
            return
        found = cache_bytes(output)
        if found is None:
            return
        name, nbytes = found
        warnings.warn(
            f"this training step's forward returned a key/value cache ({name}, {format_bytes(nbytes)}), memory "
            "the step holds but never reads (memprof counts it in the step's memory). Train with "
            "model.config.use_cache = False (or pass use_cache=False) to leave it out, as Hugging Face's "
            "gradient_checkpointing_enable() does", KeyValueCacheWarning, stacklevel=2)
        self.remove()  # once is enough, and later steps pay nothing

    def remove(self) -> None:
        """Removes the hook (idempotent)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
