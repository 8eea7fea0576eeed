"""Finding the storages behind a module's inputs, outputs and an optimizer's state.

Shared by the hooks (on the training thread's hot path, hence :func:`pointers`) and by the
profiler's set-up, which needs exact storage sizes for memory that predates profiling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from memprof.analysis.records import ModuleInfo, Storage

__all__ = ["fake_addresses", "grad_tensors", "module_tree", "optimizer_state", "optimizer_state_addresses", "pointer",
           "pointers", "storage_address", "storages", "tensors"]

# Fake tensors (memprof.estimation) have storages on the meta device, whose data pointer is 0 for all of them.
# While fake addresses are on, such a storage is named by the address of its StorageImpl instead, which is
# unique while it lives, as a real block's address is: the fake allocation stream and the hooks both name
# storages through :func:`storage_address`, so they agree.
_fake_address_users = 0


@contextlib.contextmanager
def fake_addresses() -> Iterator[None]:
    """Within the block, meta storages are named by their StorageImpl's address (see :func:`storage_address`)."""
    global _fake_address_users
    _fake_address_users += 1
    try:
        yield
    finally:
        _fake_address_users -= 1


def storage_address(storage: torch.UntypedStorage) -> int:
    """The address a storage is known by: its data pointer, or for a fake tensor's storage (while a fake
    allocation stream runs, see :func:`fake_addresses`) the address of its StorageImpl."""
    if _fake_address_users and storage.device.type == "meta":
        return int(storage._cdata)
    return storage.data_ptr()


def storages(obj: Any, out: list[Storage] | None = None, depth: int = 0, exact: bool = True) -> list[Storage]:
    """Collects (address, bytes) of the storages of every tensor in a nested output structure.

    With ``exact=False`` (:func:`pointers`) plain tensors give the tensor's own bytes, not the
    storage's, and cost no storage object.
    """
    if out is None:
        out = []
    cls = type(obj)
    # Plain tensors and parameters, nearly every call, skip the isinstance and DTensor checks (hot path).
    plain = cls is torch.Tensor or cls is nn.Parameter
    if plain and not exact:
        try:
            ptr = obj.data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse or nested tensors have no single storage
            return out
        out.append((ptr - obj.storage_offset() * obj.element_size(), obj.nbytes))
    elif plain or isinstance(obj, torch.Tensor):
        if not plain and hasattr(obj, "to_local") and hasattr(obj, "device_mesh"):
            obj = obj.to_local()  # a DTensor (FSDP2, tensor parallel): this rank's shard holds the memory
        try:
            storage = obj.untyped_storage()
            out.append((storage_address(storage), storage.nbytes()))
        except (RuntimeError, NotImplementedError):  # sparse, nested or subclass tensors
            pass
    elif depth < 4 and (cls is tuple or cls is list or isinstance(obj, (tuple, list))):
        for item in obj:
            storages(item, out, depth + 1, exact)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            storages(item, out, depth + 1, exact)
    return out


def pointers(obj: Any, out: list[Storage] | None = None) -> list[Storage]:
    """:func:`storages` for the hooks' hot paths: (storage address, the tensor's own bytes).

    ``Tensor.untyped_storage()`` makes a Python storage object that lives as long as the storage,
    and creating and later freeing one for every activation and gradient cost the training thread
    more than all the rest of a hook (0.5-1 ms a step on the benchmark models). The address comes
    from ``data_ptr()`` less the view's offset instead; the storage's size is not known here, so
    the tensor's ``nbytes`` stands in, and the analysis takes the allocator's size wherever the
    storage was allocated during profiling (always, but for inputs made before it began). Tensor
    subclasses (DTensor and the like) take the exact path.
    """
    return storages(obj, out, 0, False)


def pointer(tensor: torch.Tensor) -> Storage | None:
    """:func:`pointers` of one tensor: its one entry, or ``None`` where it has no single storage.

    A plain tensor's address is computed here, without the generic walk (gradients, one per call of the
    hooks that see them, are the hot path's commonest case).
    """
    if type(tensor) is torch.Tensor:
        try:
            # (an int for eager tensors; SymInt only when traced)
            return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size(), tensor.nbytes  # type: ignore[return-value]
        except (RuntimeError, NotImplementedError):  # sparse or nested tensors have no single storage
            return None
    found = storages(tensor, None, 0, False)
    return found[0] if found else None


def tensors(obj: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    """Every tensor in a nested structure of tuples, lists and dicts (four levels deep at most)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (tuple, list)):
        for item in obj:
            yield from tensors(item, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            yield from tensors(item, depth + 1)


def grad_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors in ``obj`` that require grad: those whose gradient backward will compute."""
    # Most modules take one tensor and return one: answer those without the generic walk (hot path).
    if type(obj) is tuple and len(obj) == 1:
        obj = obj[0]
    if type(obj) is torch.Tensor:
        return [obj] if obj.requires_grad else []
    return [t for t in tensors(obj) if t.requires_grad]


def optimizer_state(optimizer: torch.optim.Optimizer | None, exact: bool = True) -> list[Storage]:
    """Storages of every tensor in an optimizer's state (step counters included); see :func:`storages`."""
    if optimizer is None:
        return []
    found: list[Storage] = []
    for state in optimizer.state.values():
        storages(list(state.values()), found, 0, exact)
    return found


def optimizer_state_addresses(optimizer: torch.optim.Optimizer) -> list[int]:
    """The addresses of :func:`optimizer_state` with ``exact=False``, in its order: for the optimizer's step hook.

    Every step reads every state tensor (three per parameter for Adam); a plain tensor's address is computed
    in line rather than by the generic walk, which cost the training thread 0.3 ms a step on a model of 52
    parameters. Anything else takes the walk, so the result is :func:`optimizer_state`'s.
    """
    found: list[int] = []
    append = found.append
    for state in optimizer.state.values():
        for value in state.values():
            if type(value) is torch.Tensor:
                try:
                    ptr = value.data_ptr() - value.storage_offset() * value.element_size()
                except (RuntimeError, NotImplementedError):  # sparse or nested tensors have no single storage
                    continue
                append(ptr)  # type: ignore[arg-type]  # (an int for eager tensors; SymInt only when traced)
            elif isinstance(value, (torch.Tensor, tuple, list, dict)):  # depth 1: as the walk of the state's values
                found.extend(ptr for ptr, _ in storages(value, None, 1, False))
    return found


def module_tree(model: nn.Module) -> tuple[list[str], list[nn.Module]]:
    """Qualified names and modules, root first (``""``); a module reused under two names appears once."""
    names, modules, seen = [], [], set()
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen:
            continue
        seen.add(id(module))
        names.append(name)
        modules.append(module)
    return names, modules


def describe_modules(names: list[str], modules: list[nn.Module], params: list[nn.Parameter]) -> list[ModuleInfo]:
    """Builds :class:`ModuleInfo` for every module (names and modules root first)."""
    index_of_name = {name: i for i, name in enumerate(names)}
    index_of_param = {id(p): i for i, p in enumerate(params)}
    infos = []
    for name, module in zip(names, modules):
        parent = -1 if name == "" else index_of_name.get(name.rpartition(".")[0], 0)
        buffers = {storage_address(b.untyped_storage()): b.untyped_storage().nbytes() for b in module.buffers()}
        infos.append(ModuleInfo(
            name=name,
            parent=parent,
            depth=0 if name == "" else name.count(".") + 1,
            kind=type(module).__name__,
            param_indices=tuple(index_of_param[id(p)] for p in module.parameters() if id(p) in index_of_param),
            buffer_bytes=sum(buffers.values()),
        ))
    return infos
