"""Streamed weights: a stage's parameters live in host memory and visit the device around its computations.

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling ``offload``).
The rules are :mod:`planner.simulation.weight_streams`'s, point for point:

* When the schedule is installed, each streamed stage's parameters move to host memory (pinned on CUDA):
  ``param.data`` is the host master copy between steps, so the optimizer step of those parameters runs on
  the host. Parameters shared with another stage are not streamed (both stages would need them).
* As each computation (``F_*`` or ``B``, the loss excluded) starts, the parameters of the next run of
  computations on a streamed stage (:func:`next_runs`) start copying into fresh device memory on the
  host-to-device side stream, unless they are there; before a computation on a streamed stage, the compute
  stream waits for its copy and ``param.data`` points at it. After the last of a run of computations on the stage, ``param.data`` is the host copy again and
  the device copy is dropped.
* Autograd keeps what a recorded forward saved, parameters and views of them included. Under
  ``saved_tensors_hooks`` a saved tensor over a streamed parameter's device copy is packed as which
  parameter and which view (dtype, size, stride, offset), and rebuilt over the device copy present when
  ``B(l)`` runs, so the recording does not pin the device copy.
* ``B(l)`` accumulates the stage's parameter gradients on the device (the host gradients are set aside for
  it); they are copied to the host on the device-to-host side stream as ``B(l)`` ends, and retired before
  the computation after the next one: the compute stream waits, the host gradient becomes ``param.grad``
  (or the copy is added to the one set aside, as autograd would have accumulated it), and host buffers
  go back to the pool.

Without CUDA the same path runs with host-to-host copies (the "device" copy is a fresh CPU tensor), which is
what the CPU tests check: bitwise gradients, parameters back in place, every buffer returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from planner.executor.offload import Copier, HostPool, storage_key


def next_runs(sequence: Sequence[int], streamed: Any) -> list[int | None]:
    """For each computation, the stage of the next run on a streamed stage after it (``None``: none).

    A run starts where the stage changes; the run the computation belongs to does not count. The same
    function as :func:`planner.simulation.weight_streams.next_runs` (this runtime imports nothing from the planner).
    """
    out: list[int | None] = [None] * len(sequence)
    upcoming: int | None = None
    for index in range(len(sequence) - 1, -1, -1):
        out[index] = upcoming
        stage = sequence[index]
        if stage in streamed and (index == 0 or sequence[index - 1] != stage):
            upcoming = stage
    return out


def state_follows_parameters(optimizer: torch.optim.Optimizer) -> int:
    """Moves each of ``optimizer``'s state tensors to the device its parameter is on now.

    Streamed parameters live in host memory between steps, so their optimizer step runs there. State the
    optimizer made while they were on the device (it stepped before the schedule was applied, or after it
    was removed) must follow them, or the optimizer's multi-tensor kernels refuse the mixed devices.
    Scalars on the CPU (Adam's step counter) stay: optimizers take them there for any parameter.

    Returns:
        How many state tensors moved.
    """
    moved = 0
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor) or value.device == param.device:
                continue
            if value.dim() == 0 and value.device.type == "cpu":
                continue
            state[key] = value.to(param.device)
            moved += 1
    return moved


class _WeightRef:
    """What autograd keeps of a saved tensor over a streamed parameter: which one, and which view."""

    __slots__ = ("param", "dtype", "size", "stride", "offset")

    def __init__(self, param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        self.param = param
        self.dtype, self.size, self.stride, self.offset = tensor.dtype, tensor.size(), tensor.stride(), tensor.storage_offset()


class WeightStreamer:
    """The streamed stages' parameters of one installed schedule, and their copies during a step.

    Args:
        stages: for each streamed stage, its parameters (``{stage: [param, ...]}``).
        sequence: the stage of each computation the executor runs, in order (loss and transfers left out).
        pool: the executor's host buffers (for gradients added to existing ones).
        copiers: the executor's side streams by device.
    """

    def __init__(self, stages: dict[int, list[torch.nn.Parameter]], sequence: Sequence[int], pool: HostPool,
                 copiers: dict[torch.device, Copier]) -> None:
        self.params = stages
        self.sequence = list(sequence)
        self.upcoming = next_runs(self.sequence, set(stages))
        self.pool, self.copiers = pool, copiers
        self.device: torch.device | None = None
        self.host: dict[int, torch.Tensor] = {}  # id(param) -> host master copy
        self.index = 0
        self.present: dict[int, tuple[list[torch.Tensor], Any]] = {}  # stage -> (device copies, copy-done event)
        self.keys: dict[int, torch.nn.Parameter] = {}  # storage address of a device copy -> its parameter
        self.aside: dict[int, torch.Tensor | None] = {}  # id(param) -> host gradient set aside during B
        self.leaving: list[tuple[int, list[tuple[torch.nn.Parameter, Any, Any, bool]], Any]] = []

    def place(self, device: torch.device) -> None:
        """Moves the streamed parameters to host memory (once; pinned when ``device`` is CUDA)."""
        self.device = device
        for params in self.params.values():
            for param in params:
                if id(param) in self.host:
                    continue
                if param.device.type == "cpu" and (device.type == "cpu" or param.data.is_pinned()):
                    host = param.data
                else:
                    host = torch.empty(param.shape, dtype=param.dtype, pin_memory=device.type == "cuda")
                    host.copy_(param.data)
                    param.data = host
                    if param.grad is not None:
                        param.grad = param.grad.to("cpu")
                self.host[id(param)] = host

    def restore(self) -> None:
        """Gives every streamed parameter back to the device (the schedule is removed)."""
        for params in self.params.values():
            for param in params:
                host = self.host.pop(id(param), None)
                if host is not None and self.device is not None and self.device.type != "cpu":
                    param.data = host.to(self.device)
                    if param.grad is not None:
                        param.grad = param.grad.to(self.device)

    def _copier(self) -> Copier:
        assert self.device is not None
        copier = self.copiers.get(self.device)
        if copier is None:
            copier = self.copiers[self.device] = Copier(self.device)
        return copier

    def _fetch(self, stage: int) -> None:
        """Starts copying ``stage``'s parameters into fresh device memory."""
        assert self.device is not None
        copier = self._copier()
        copies: list[torch.Tensor] = []
        done = None
        if copier.cuda:
            assert copier.h2d is not None
            copies = [torch.empty_like(self.host[id(p)], device=self.device) for p in self.params[stage]]
            copier.h2d.wait_stream(torch.cuda.current_stream(self.device))  # the memory is free to write
            with torch.cuda.stream(copier.h2d):
                for copy, param in zip(copies, self.params[stage]):
                    copy.copy_(self.host[id(param)], non_blocking=True)
                done = torch.cuda.Event()
                done.record()
        else:
            copies = [self.host[id(p)].clone() for p in self.params[stage]]
        self.present[stage] = (copies, done)
        for copy, param in zip(copies, self.params[stage]):
            self.keys[storage_key(copy)] = param

    def _evict(self, stage: int) -> None:
        copies, _ = self.present.pop(stage)
        for copy, param in zip(copies, self.params[stage]):
            self.keys.pop(storage_key(copy), None)
            param.data = self.host[id(param)]

    def enter(self, stage: int, backward: bool) -> None:
        """Before computation number ``index`` (on ``stage``): the rules in the module's docstring."""
        if self.index >= len(self.sequence) or self.sequence[self.index] != stage:
            due = self.sequence[self.index] if self.index < len(self.sequence) else "none"
            raise RuntimeError(f"weight streaming expected a computation on stage {due}, found stage {stage}; the "
                               "executor runs the schedule's operations in its order")
        self._retire(self.index - 1)
        if stage in self.params:
            if stage not in self.present:
                self._fetch(stage)
            copies, done = self.present[stage]
            if done is not None:
                torch.cuda.current_stream(self.device).wait_event(done)
            for copy, param in zip(copies, self.params[stage]):
                param.data = copy
            if backward:  # autograd accumulates on the device copy; the host gradient waits aside
                for param in self.params[stage]:
                    self.aside[id(param)] = param.grad
                    param.grad = None
        upcoming = self.upcoming[self.index]
        if upcoming is not None and upcoming not in self.present:
            self._fetch(upcoming)

    def leave(self, stage: int, backward: bool) -> None:
        """After the computation entered last."""
        if stage in self.params:
            if backward:
                self._send_grads(stage)
            following = self.sequence[self.index + 1] if self.index + 1 < len(self.sequence) else None
            if following != stage:
                self._evict(stage)
        self.index += 1

    def _send_grads(self, stage: int) -> None:
        """Starts copying ``stage``'s new gradients to the host."""
        copier = self._copier()
        moving: list[tuple[torch.nn.Parameter, Any, Any, bool]] = []
        done = None
        if copier.cuda:
            assert copier.d2h is not None
            copier.d2h.wait_stream(torch.cuda.current_stream(self.device))
        for param in self.params[stage]:
            grad = param.grad
            param.grad = None
            aside = self.aside.pop(id(param), None)
            if grad is None:  # no gradient this step: the one set aside comes back as it was
                if aside is not None:
                    moving.append((param, None, aside, True))
                continue
            if aside is None:
                target = torch.empty(grad.shape, dtype=grad.dtype, pin_memory=copier.cuda)
            else:
                target = self.pool.take(grad.numel() * grad.element_size(), copier.cuda).view(grad.dtype).view(grad.shape)
            if copier.cuda:
                with torch.cuda.stream(copier.d2h):
                    target.copy_(grad, non_blocking=True)
            else:
                target.copy_(grad)
            moving.append((param, grad, target, True) if aside is None else (param, grad, _AddTo(aside, target), False))
        if copier.cuda and moving:
            with torch.cuda.stream(copier.d2h):
                done = torch.cuda.Event()
                done.record()
        self.leaving.append((self.index, moving, done))

    def _retire(self, before: int) -> None:
        """Retires the gradient copies issued by computations before ``before``."""
        keep = []
        for index, moving, done in self.leaving:
            if index >= before:
                keep.append((index, moving, done))
                continue
            if done is not None:
                done.synchronize()
            for param, _, target, fresh in moving:
                if fresh:
                    param.grad = target
                else:
                    target.apply(param, self.pool)
        self.leaving = keep

    def finish(self) -> None:
        """The step's backward is over: every copy retired, every parameter on the host."""
        self._retire(len(self.sequence) + 1)
        for stage in list(self.present):
            self._evict(stage)
        self.index = 0

    def hooks(self, inner: tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]] | None
              ) -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
        """Pack and unpack hooks that keep streamed parameters out of a recording (``inner``: the stash's)."""
        def pack(tensor: torch.Tensor) -> Any:
            try:
                param = self.keys.get(storage_key(tensor))
            except (RuntimeError, NotImplementedError):
                param = None
            if param is not None:
                return _WeightRef(param, tensor)
            return inner[0](tensor) if inner is not None else tensor

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, _WeightRef):
                data = packed.param.data
                return torch.empty(0, dtype=packed.dtype, device=data.device).set_(
                    data.untyped_storage(), packed.offset, packed.size, packed.stride)
            return inner[1](packed) if inner is not None else packed

        return pack, unpack


class _AddTo:
    """A gradient copied to a pooled host buffer, to be added to the host gradient set aside."""

    __slots__ = ("aside", "buffer")

    def __init__(self, aside: torch.Tensor, buffer: torch.Tensor) -> None:
        self.aside, self.buffer = aside, buffer

    def apply(self, param: torch.nn.Parameter, pool: HostPool) -> None:
        self.aside.add_(self.buffer)
        param.grad = self.aside
        pool.give(self.buffer.view(torch.uint8).view(-1))
