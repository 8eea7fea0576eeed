"""Hooks that note what happens during a training step, as cheaply as possible.

The hooks only append small tuples (time, kind, module index, storage addresses) to lists; all
analysis happens later in :mod:`memprof.attribution`. No hook keeps a reference to a tensor.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from functools import partial
from time import time_ns
from typing import Any

import torch
from torch import nn

from memprof.categories import Category
from memprof.records import CAT, Mark, Storage

__all__ = ["CAT", "HookRecorder", "Mark", "Storage", "module_tree", "optimizer_state", "pointers", "storages"]


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
            out.append((storage.data_ptr(), storage.nbytes()))
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


def _tensors(obj: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, depth + 1)


def _grad_tensors(obj: Any) -> list[torch.Tensor]:
    # Most modules take one tensor and return one: answer those without the generic walk (hot path).
    if type(obj) is tuple and len(obj) == 1:
        obj = obj[0]
    if type(obj) is torch.Tensor:
        return [obj] if obj.requires_grad else []
    return [t for t in _tensors(obj) if t.requires_grad]


# Enum members looked up once: attribute access on an Enum class costs more than a global (hot paths).
_FWD_ENTER, _FWD_EXIT, _BWD_ENTER, _BWD_EXIT = Mark.FWD_ENTER, Mark.FWD_EXIT, Mark.BWD_ENTER, Mark.BWD_EXIT
_WEIGHT_GRADS = CAT[Category.WEIGHT_GRADS]


class HookRecorder:
    """Registers the profiler's hooks and records marks and observations.

    Attributes:
        marks: ``(time_ns, Mark, module_index, storages)`` in call order.
        observations: ``(time_ns, data_ptr, category_code, nbytes)``: a storage seen in a role that
            no mark implies (weight gradients, optimizer state); the storages in marks are observed
            from the marks themselves (:mod:`memprof.attribution`).
        param_grads: parameter index -> (data_ptr, nbytes) of its gradient seen this iteration.
    """

    def __init__(self, modules: list[nn.Module], params: list[nn.Parameter],
                 optimizer: torch.optim.Optimizer | None) -> None:
        self.modules = modules
        self.params = params
        self.optimizer = optimizer
        self.marks: list[tuple[int, int, int, Any]] = []
        self.observations: list[tuple[int, int, int, int]] = []
        # On CPU the allocator does not report frees of storages allocated before profiling began,
        # so inputs are watched for their death too.
        self.watch_inputs = False
        self.param_grads: dict[int, Storage] = {}
        self._free_sink: list[tuple[int, int]] = []
        self._handles: list[Any] = []
        self._finalizers: list[weakref.finalize] = []
        self._backward_active = False
        # Names this recorder's entry in autograd nodes' metadata, apart from any other recorder's.
        self._node_key = f"memprof-{id(self)}"
        # Module owning each parameter: the guard names it when a weight gradient crosses the budget.
        position = {id(p): i for i, p in enumerate(params)}
        self._owner = {}
        for index, module in enumerate(modules):
            for param in module.parameters(recurse=False):
                self._owner.setdefault(position.get(id(param), -1), index)
        self.enabled = True
        # Called at every forward and backward mark when a memory budget is guarded.
        self.guard: Callable[[int, int], None] | None = None

    # ----------------------------------------------------------------- attach / detach
    def attach(self) -> None:
        """Registers every hook."""
        for index, module in enumerate(self.modules):
            self._handles.append(module.register_forward_pre_hook(partial(self._forward_pre, index)))
            self._handles.append(module.register_forward_hook(partial(self._forward_post, index)))
        for index, param in enumerate(self.params):
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(partial(self._grad_ready, index)))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._optimizer_pre))
            self._handles.append(self.optimizer.register_step_post_hook(self._optimizer_post))

    def detach(self) -> None:
        """Removes every hook and finalizer; the model is as it was before :meth:`attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()

    def watch_free(self, tensor: torch.Tensor) -> None:
        """Notes when a pre-existing storage dies (the CPU allocator does not report it)."""
        found = storages(tensor)
        if not found:
            return
        try:
            storage = (tensor.to_local() if hasattr(tensor, "device_mesh") else tensor).untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr = found[0][0]
        self._finalizers.append(weakref.finalize(storage, _note_free, self._free_sink, ptr))

    def drain(self) -> tuple[list, list, dict, list]:
        """Returns and clears what was recorded since the last drain.

        Returns:
            ``(marks, observations, param_grads, baseline_frees)``; the last holds
            ``(time_ns, data_ptr)`` of watched pre-existing storages that died.
        """
        frees = list(self._free_sink)
        self._free_sink.clear()  # in place: the finalizers hold this list
        self._finalizers = [f for f in self._finalizers if f.alive]
        out = (self.marks, self.observations, self.param_grads, frees)
        self._backward_active = False  # a backward that raised never ran its end callback
        self.marks, self.observations, self.param_grads = [], [], {}
        return out

    # ----------------------------------------------------------------- forward
    def _forward_pre(self, index: int, module: nn.Module, args: Any) -> None:
        if not self.enabled or _compiling():
            return
        now = time_ns()
        # The model's inputs may predate profiling, so their exact storage sizes are needed (once a step).
        found = storages(args) if index == 0 else pointers(args)
        self.marks.append((now, _FWD_ENTER, index, found))
        if self.guard is not None:
            self.guard(index, _FWD_ENTER)
        if index == 0 and self.watch_inputs:
            for tensor in _tensors(args):
                self.watch_free(tensor)
        if torch.is_grad_enabled():
            self._watch_backward(_grad_tensors(args), _BWD_EXIT, index)

    def _forward_post(self, index: int, module: nn.Module, args: Any, output: Any) -> None:
        if not self.enabled or _compiling():
            return
        now = time_ns()
        found = pointers(output)
        self.marks.append((now, _FWD_EXIT, index, found))
        if self.guard is not None:
            self.guard(index, _FWD_EXIT)
        if torch.is_grad_enabled():
            self._watch_backward(_grad_tensors(output), _BWD_ENTER, index)

    # ----------------------------------------------------------------- backward
    def _watch_backward(self, tensors: list[torch.Tensor], kind: Mark, index: int) -> None:
        """Arranges for ``kind`` to be marked when the gradient of the first of ``tensors`` is ready.

        A gradient is ready just before the autograd node that made the tensor runs, so the mark
        waits on that node. In a chain one activation is the output of one module and the input of
        the next, often of their parents too: all those marks share one pre-hook on the node, in
        the order they were asked for, rather than one Python tensor hook each (the hooks were
        most of the profiler's cost on the training thread).
        """
        token = [False]  # the module call's mark is made once, by whichever tensor is ready first
        for tensor in tensors:
            node = tensor.grad_fn
            if node is None:  # a leaf that requires grad: only a tensor hook sees its gradient
                tensor.register_hook(partial(self._leaf_ready, kind, index, token))
                continue
            metadata = node.metadata
            pending = metadata.get(self._node_key)
            if pending is None:
                pending = metadata[self._node_key] = []
                node.register_prehook(partial(self._node_ready, pending))
            pending.append((kind, index, token, tensor.output_nr))

    def _node_ready(self, pending: list[tuple[Mark, int, list[bool], int]], grads: tuple) -> None:
        if not self.enabled:
            return
        now = time_ns()
        for kind, index, token, output_nr in pending:
            if not token[0]:
                token[0] = True
                grad = grads[output_nr] if output_nr < len(grads) else None
                self._backward_mark(now, kind, index, grad)

    def _leaf_ready(self, kind: Mark, index: int, token: list[bool], grad: torch.Tensor | None) -> None:
        if self.enabled and not token[0]:
            token[0] = True
            self._backward_mark(time_ns(), kind, index, grad)

    def _backward_mark(self, now: int, kind: Mark, index: int, grad: torch.Tensor | None) -> None:
        found = pointers(grad) if grad is not None else []
        self.marks.append((now, kind, index, found))
        if not self._backward_active:
            self._backward_active = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        if self.guard is not None:
            self.guard(index, kind)

    def _backward_done(self) -> None:
        self._backward_active = False
        if self.enabled:
            self.marks.append((time_ns(), Mark.BWD_END, -1, ()))
            if self.guard is not None:
                self.guard(-1, Mark.BWD_END)

    def _grad_ready(self, index: int, param: torch.Tensor) -> None:
        if not self.enabled or param.grad is None:
            return
        found = pointers(param.grad)
        if found:
            self.param_grads[index] = found[0]
            self.observations.append((time_ns(), found[0][0], _WEIGHT_GRADS, 0))
        if self.guard is not None:
            self.guard(self._owner.get(index, -1), _BWD_EXIT)

    # ----------------------------------------------------------------- optimizer
    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.enabled:
            self.marks.append((time_ns(), Mark.OPT_ENTER, -1, ()))

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.enabled:
            return
        now = time_ns()
        code = CAT[Category.OPTIMIZER_STATE]
        # every step: the cheap addresses, sizes are not needed
        self.observations.extend((now, ptr, code, 0) for ptr, _ in optimizer_state(optimizer, exact=False))
        self.marks.append((time_ns(), Mark.OPT_EXIT, -1, ()))


def optimizer_state(optimizer: torch.optim.Optimizer | None, exact: bool = True) -> list[Storage]:
    """Storages of every tensor in an optimizer's state (step counters included); see :func:`storages`."""
    if optimizer is None:
        return []
    found: list[Storage] = []
    for state in optimizer.state.values():
        storages(list(state.values()), found, 0, exact)
    return found


# Inside a torch.compile trace the hooks must do nothing Dynamo cannot trace (time.time_ns); the
# compiled graph then runs without them, which the profiler reports as a warning. Looked up once,
# not on every module call.
_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _note_free(sink: list[tuple[int, int]], ptr: int) -> None:
    sink.append((time_ns(), ptr))


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


HookFn = Callable[..., None]
