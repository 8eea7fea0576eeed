"""Hooks that note what happens during a training step, as cheaply as possible.

The hooks only append small tuples (time, kind, module index, storage addresses) to lists; all
analysis happens later in :mod:`memprof.analysis.attribution`. No hook keeps a reference to a tensor.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import torch
from torch import nn

from memprof.analysis.records import CAT, Drained, FreeRow, Mark, MarkRow, ObservationRow, Storage
from memprof.capture.tensor_walk import (
    grad_tensors,
    optimizer_state_addresses,
    pointer,
    pointers,
    storages,
    tensors,
)
from memprof.capture.weight_copies import AutocastCasts
from memprof.categories import Category

__all__ = ["HookRecorder", "now_ns", "use_clock"]

# The clock every mark is stamped with: the wall clock, or while an estimate runs its virtual clock
# (memprof.estimation.clock), which advances by each operator's predicted time. A module global, read as
# cheaply as the plain time.time_ns it usually is (the hooks are the training thread's hot path).
time_ns: Callable[[], int] = time.time_ns


def now_ns() -> int:
    """The current time on the clock the hooks stamp their marks with."""
    return time_ns()


@contextlib.contextmanager
def use_clock(clock: Callable[[], int]) -> Iterator[None]:
    """Stamps marks (and the profiler's iteration times) with ``clock`` inside the block."""
    global time_ns
    saved, time_ns = time_ns, clock
    try:
        yield
    finally:
        time_ns = saved


# Enum members looked up once: attribute access on an Enum class costs more than a global (hot paths).
_FWD_ENTER, _FWD_EXIT, _BWD_ENTER, _BWD_EXIT = Mark.FWD_ENTER, Mark.FWD_EXIT, Mark.BWD_ENTER, Mark.BWD_EXIT
_WEIGHT_GRADS = CAT[Category.WEIGHT_GRADS]
_INPUTS = CAT[Category.INPUTS]
_WEIGHT_COPIES = CAT[Category.WEIGHT_COPIES]
_OPTIMIZER_STATE = CAT[Category.OPTIMIZER_STATE]


class HookRecorder:
    """Registers the profiler's hooks and records marks and observations.

    Attributes:
        marks: the marks in call order (:data:`memprof.analysis.records.MarkRow`).
        observations: storages seen in a role that no mark implies (weight gradients, optimizer
            state); the storages in marks are observed from the marks themselves
            (:mod:`memprof.analysis.attribution`).
        param_grads: parameter index -> (data_ptr, nbytes) of its gradient seen this iteration.
    """

    def __init__(self, modules: list[nn.Module], params: list[nn.Parameter],
                 optimizer: torch.optim.Optimizer | None) -> None:
        self.modules = modules
        self.params = params
        self.optimizer = optimizer
        self.marks: list[MarkRow] = []
        self.observations: list[ObservationRow] = []
        # On CPU the allocator does not report frees of storages allocated before profiling began,
        # so inputs are watched for their death too.
        self.watch_inputs = False
        self.param_grads: dict[int, Storage] = {}
        self._free_sink: list[FreeRow] = []
        self._handles: list[Any] = []
        self._full_handles: list[Any] = []  # what set_full_hooks() registers and removes
        self.muted: frozenset[int] = frozenset()  # modules whose forward hooks stay off (mute())
        self._full = False
        # data_ptr -> the finalizer watching that storage; one per storage, however often it is seen
        self._finalizers: dict[int, weakref.finalize] = {}
        self._backward_active = False
        # Names this recorder's entry in autograd nodes' metadata, apart from any other recorder's.
        self._node_key = f"memprof-{id(self)}"
        # Module owning each parameter: the guard names it when a weight gradient crosses the budget.
        position = {id(p): i for i, p in enumerate(params)}
        self._owner: dict[int, int] = {}
        for index, module in enumerate(modules):
            for param in module.parameters(recurse=False):
                self._owner.setdefault(position.get(id(param), -1), index)
        self.enabled = True
        # Called at every forward and backward mark when a memory budget is guarded.
        self.guard: Callable[[int, int], None] | None = None
        # Modules whose forward pre-hook must run before the others': FSDP2's unshards its parameters in its
        # own pre-hook, and that allocation belongs to the module's forward (memprof/capture/distributed.py).
        self.first_pre_hooks: set[int] = set()
        self._casts = AutocastCasts()
        # Called at each of the root's forward marks and at the backward's end, as they are made (the device's
        # clock there: memprof/capture/phase_clock.py).
        self.stamp: Callable[[], None] = _nothing

    # ----------------------------------------------------------------- attach / detach
    def attach(self) -> None:
        """Registers every hook."""
        root = self.modules[0]
        first = 0 in self.first_pre_hooks
        # the root also sees keyword arguments: model(input_ids=..., labels=...) is a batch too
        self._handles.append(root.register_forward_pre_hook(self._root_forward_pre, with_kwargs=True, prepend=first))
        self._handles.append(root.register_forward_hook(self._root_forward_post))
        self.set_full_hooks(True)
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._optimizer_pre))
            self._handles.append(self.optimizer.register_step_post_hook(self._optimizer_post))

    def set_full_hooks(self, on: bool) -> None:
        """Registers (``on``) or removes the hooks a steady iteration goes without: the submodules' forward hooks,
        the gradients' hooks and the optimizer's look at its state. The model's own hooks and the optimizer's
        marks stay.

        Off while training repeats itself (:mod:`memprof.capture.steady`): they are most of what the hooks cost
        the training thread, and a steady iteration's marks and observations come from the template of one that
        had them.
        """
        if on == self._full:
            return
        self._full = on
        if not on:
            for handle in self._full_handles:
                handle.remove()
            self._full_handles.clear()
            return
        for index, module in enumerate(self.modules[1:], start=1):
            if index in self.muted:
                continue
            self._full_handles.append(module.register_forward_pre_hook(
                partial(self._forward_pre, index), prepend=index in self.first_pre_hooks))
            self._full_handles.append(module.register_forward_hook(partial(self._forward_post, index)))
        for index, param in enumerate(self.params):
            if param.requires_grad:
                hook = partial(self._grad_ready, index)
                # it only looks: a runtime may add a gradient into .grad itself (planner.executor.grad_into)
                hook.observes_only = True  # type: ignore[attr-defined]
                self._full_handles.append(param.register_post_accumulate_grad_hook(hook))

    def mute(self, indices: Iterable[int]) -> None:
        """Leaves the forward hooks of the modules ``indices`` off (``()``: of none) from now on.

        For the submodules of a block compiled as a region of its own (:mod:`memprof.capture.regional`): inside
        the region their hooks do nothing, but dynamo guards on each one's module number, so every block would
        compile a region of its own.
        """
        self.muted = frozenset(int(i) for i in indices)
        if self._full:
            self.set_full_hooks(False)
            self.set_full_hooks(True)

    def detach(self) -> None:
        """Removes every hook and finalizer; the model is as it was before :meth:`attach`."""
        self.set_full_hooks(False)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for finalizer in self._finalizers.values():
            finalizer.detach()
        self._finalizers.clear()

    def watch_free(self, tensor: torch.Tensor) -> None:
        """Notes when a pre-existing storage dies (the CPU allocator does not report it)."""
        found = storages(tensor)
        if not found:
            return
        try:
            local = tensor.to_local() if hasattr(tensor, "device_mesh") else tensor  # type: ignore[attr-defined]  # DTensor
            storage = local.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr = found[0][0]
        watching = self._finalizers.get(ptr)
        if watching is not None and watching.alive:  # a batch fed again: one finalizer is enough
            return
        self._finalizers[ptr] = weakref.finalize(storage, _note_free, self._free_sink, ptr)

    def mark_inputs(self, obj: Any) -> None:
        """Observes the storages of every tensor in ``obj`` as inputs (see ``MemoryProfiler.mark_inputs``)."""
        now = time_ns()
        self.observations.extend((now, ptr, _INPUTS, nbytes) for ptr, nbytes in storages(obj))
        if self.watch_inputs:
            for tensor in tensors(obj):
                self.watch_free(tensor)

    def drain(self) -> Drained:
        """Returns and clears what was recorded since the last drain."""
        frees = list(self._free_sink)
        self._free_sink.clear()  # in place: the finalizers hold this list
        # Only a finalizer that ran is dead (detach() clears them all), and each that ran noted its free: the
        # others (every parameter's, on CPU) are not asked whether they live, which cost 50 µs a step.
        finalizers = self._finalizers
        for _, ptr in frees:
            watching = finalizers.get(ptr)
            if watching is not None and not watching.alive:
                del finalizers[ptr]
        out = Drained(marks=self.marks, observations=self.observations, frees=frees, param_grads=self.param_grads)
        self._backward_active = False  # a backward that raised never ran its end callback
        self._casts.reset()  # nor a forward that raised its post-hook
        self.marks, self.observations, self.param_grads = [], [], {}
        return out

    def last_mark(self) -> MarkRow | None:
        """The latest mark of the iteration so far, backward marks included (for a post-mortem)."""
        return self.marks[-1] if self.marks else None

    # ----------------------------------------------------------------- forward
    def _root_forward_pre(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        self._forward_pre(0, module, (*args, *kwargs.values()) if kwargs else args)
        if self.enabled and not _compiling():
            self.stamp()
            self._casts.begin(self._full)

    def _root_forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        self._forward_post(0, module, args, output)
        if not self.enabled or _compiling():
            return
        self.stamp()
        # autocast's casts of weights that the forward saved for backward (memprof/capture/weight_copies.py)
        found = self._casts.end(output)
        if found:
            now = time_ns()
            self.observations.extend((now, ptr, _WEIGHT_COPIES, 0) for ptr, _ in found)

    def observe(self, found: list[Storage], code: int) -> None:
        """Observes storages in the role ``code`` (a category code), now; for the profiler's watchers."""
        if self.enabled and found:
            now = time_ns()
            self.observations.extend((now, ptr, code, 0) for ptr, _ in found)

    def _forward_pre(self, index: int, module: nn.Module, args: Any) -> None:
        if not self.enabled or _compiling():
            return
        now = time_ns()
        if self._casts.watching:  # autocast entered inside the root's call (accelerate's): weight_copies.py
            self._casts.look()
        if index and type(args) is tuple and len(args) == 1 and self._plain_tensor(now, _FWD_ENTER, _BWD_EXIT,
                                                                                  index, args[0]):
            return
        # The model's inputs may predate profiling, so their exact storage sizes are needed (once a step).
        found = storages(args) if index == 0 else pointers(args)
        self.marks.append((now, _FWD_ENTER, index, found))
        if self.guard is not None:
            self.guard(index, _FWD_ENTER)
        if index == 0 and self.watch_inputs:
            for tensor in tensors(args):
                self.watch_free(tensor)
        if torch.is_grad_enabled():
            self._watch_backward(grad_tensors(args), _BWD_EXIT, index)

    def _forward_post(self, index: int, module: nn.Module, args: Any, output: Any) -> None:
        if not self.enabled or _compiling():
            return
        now = time_ns()
        if self._plain_tensor(now, _FWD_EXIT, _BWD_ENTER, index, output):
            return
        found = pointers(output)
        self.marks.append((now, _FWD_EXIT, index, found))
        if self.guard is not None:
            self.guard(index, _FWD_EXIT)
        if torch.is_grad_enabled():
            self._watch_backward(grad_tensors(output), _BWD_ENTER, index)

    def _plain_tensor(self, now: int, kind: Mark, backward_kind: Mark, index: int, obj: Any) -> bool:
        """The forward hooks' common case in one go: one plain tensor, no guard.

        Does what :func:`pointers` and :meth:`_watch_backward` would for it, without their generic
        walks (most module calls take and return one tensor; this is the training thread's hottest
        path). Returns ``False``, having done nothing, for any other case.
        """
        if type(obj) is not torch.Tensor or self.guard is not None:
            return False
        node = obj.grad_fn
        if node is None and obj.requires_grad:
            return False  # a leaf: its gradient needs a Python tensor hook
        try:
            ptr = obj.data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse or nested: no single storage
            return False
        base = ptr - obj.storage_offset() * obj.element_size()  # an int for eager tensors (SymInt only when traced)
        self.marks.append((now, kind, index, [(base, obj.nbytes)]))  # type: ignore[list-item]
        if node is not None and _grad_enabled():
            self._wait_on(node, backward_kind, index, [False], obj.output_nr)
        return True

    # ----------------------------------------------------------------- backward
    def _watch_backward(self, tensors: list[torch.Tensor], kind: Mark, index: int) -> None:
        """Arranges for ``kind`` to be marked when the gradient of the first of ``tensors`` is ready.

        A gradient is ready just before the autograd node that made the tensor runs, so the mark
        waits on that node. In a chain one activation is the output of one module and the input of
        the next, often of their parents too: all those marks share one pre-hook on the node, in
        the order they were asked for, rather than one Python tensor hook each (the hooks were
        most of the profiler's cost on the training thread).
        """
        # The module call's mark is made once, by whichever tensor is ready first: its token says so.
        token = [False]
        for tensor in tensors:
            node = tensor.grad_fn
            if node is None:  # a leaf that requires grad: only a tensor hook sees its gradient
                tensor.register_hook(partial(self._leaf_ready, kind, index, token, [False]))
            else:
                self._wait_on(node, kind, index, token, tensor.output_nr)

    def _wait_on(self, node: Any, kind: Mark, index: int, token: list[bool], output_nr: int) -> None:
        """Adds a mark to those ``node``'s one pre-hook makes when it runs (registered on the first)."""
        metadata = node.metadata
        pending = metadata.get(self._node_key)
        if pending is None:
            pending = metadata[self._node_key] = []
            node.register_prehook(partial(self._node_ready, pending))
        pending.append((kind, index, token, output_nr))

    def _node_ready(self, pending: list[tuple[Mark, int, list[bool], int]], grads: tuple) -> None:
        if not self.enabled:
            return
        now = time_ns()
        for kind, index, token, output_nr in pending:
            if not token[0]:  # (:meth:`_ready` in line: one call less per mark on the backward's hot path)
                token[0] = True
                self._backward_mark(now, kind, index, grads[output_nr] if output_nr < len(grads) else None)

    def _leaf_ready(self, kind: Mark, index: int, token: list[bool], fired: list[bool],
                    grad: torch.Tensor | None) -> None:
        # Only its first call can make the mark: the hook stays on a leaf that outlives the step.
        if self.enabled and not fired[0]:
            fired[0] = True
            self._ready(time_ns(), kind, index, token, grad)

    def _ready(self, now: int, kind: Mark, index: int, token: list[bool], grad: torch.Tensor | None) -> None:
        if not token[0]:
            token[0] = True
            self._backward_mark(now, kind, index, grad)

    def _backward_mark(self, now: int, kind: Mark, index: int, grad: torch.Tensor | None) -> None:
        found = pointer(grad) if grad is not None else None
        self.marks.append((now, kind, index, [found] if found is not None else []))
        if not self._backward_active:
            self._backward_active = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        if self.guard is not None:
            self.guard(index, kind)

    def _backward_done(self) -> None:
        self._backward_active = False
        if self.enabled:
            self.marks.append((time_ns(), Mark.BWD_END, -1, ()))
            self.stamp()
            if self.guard is not None:
                self.guard(-1, Mark.BWD_END)

    def _grad_ready(self, index: int, param: torch.Tensor) -> None:
        if not self.enabled:
            return
        grad = param.grad
        if grad is None:
            return
        found = pointer(grad)
        if found is not None:
            self.param_grads[index] = found
            self.observations.append((time_ns(), found[0], _WEIGHT_GRADS, 0))
        if self.guard is not None:
            self.guard(self._owner.get(index, -1), _BWD_EXIT)

    # ----------------------------------------------------------------- optimizer
    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if not self.enabled:
            return None
        # torch passes the step's own arguments with the optimizer first: (optimizer, closure)
        first = 1 if args and args[0] is optimizer else 0
        closure = kwargs.get("closure") if "closure" in kwargs else (
            args[first] if len(args) == first + 1 else None)
        if not callable(closure):
            self.marks.append((time_ns(), Mark.OPT_ENTER, -1, ()))
            return None
        # step(closure) runs the closure's forward and backward inside the step (Lightning does, and
        # LBFGS): the optimizer's own work starts when the closure returns, so that is where it is marked.
        marked = partial(self._after_closure, closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": marked}
        return (*args[:first], marked), kwargs

    def _after_closure(self, closure: Callable[[], Any]) -> Any:
        loss = closure()
        if self.enabled:
            self.marks.append((time_ns(), Mark.OPT_ENTER, -1, ()))
        return loss

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.enabled:
            return
        now = time_ns()
        if self._full:  # every hooked step: the cheap addresses, sizes are not needed
            self.observations.extend([(now, ptr, _OPTIMIZER_STATE, 0)
                                      for ptr in optimizer_state_addresses(optimizer)])
        self.marks.append((time_ns(), Mark.OPT_EXIT, -1, ()))


# Inside a torch.compile trace the hooks must do nothing Dynamo cannot trace (time.time_ns); the
# compiled graph then runs without them, which the profiler reports as a warning. Looked up once,
# not on every module call.
_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

_grad_enabled = torch.is_grad_enabled


def _nothing() -> None:
    pass


def _note_free(sink: list[tuple[int, int]], ptr: int) -> None:
    sink.append((time_ns(), ptr))
