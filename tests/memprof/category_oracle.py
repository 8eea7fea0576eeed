"""An oracle for every memory category that shares nothing with memprof's attribution.

memprof files each allocator block into a category from its own hook marks (module outputs, the blocks a
forward leaves alive, the gradients its backward marks see). This oracle finds the same quantities another way,
in a separate run of the same deterministic step:

* where tensors live, from the test's own hooks: autograd's ``saved_tensors_hooks`` (what a forward saved,
  tracked by weak references until autograd drops it), the tensors each module returned, the gradients an
  autograd node receives (a pre-hook on the module output's ``grad_fn``), the parameters' ``.grad`` and the
  optimizer's state, read at the moment;
* how much is allocated, from the allocator itself: torch.profiler's raw ``[memory]`` events, summed in time
  order on top of the storages alive when the step starts. Each hook marks its moment in that stream by
  allocating and freeing a block of a size no tensor of the test model has (``MARK_BYTES + k`` for the k-th
  moment), so no clocks need to be matched.

``other`` is then what the allocator holds besides every category found by the hooks. A step under
:class:`~memprof.MemoryProfiler` allocates exactly what the same step under torch.profiler does (the test
models are deterministic: no dropout), so each moment's numbers compare with memprof's events row made by the
same kind of hook at the same point (a module's forward exit, its backward enter, the optimizer's step).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: Marker blocks are this size plus the moment's index: far above any tensor of the oracle's test models.
MARK_BYTES = 90_000_001
_MAX_MOMENTS = 10_000


@dataclass(frozen=True)
class Moment:
    """One moment of a step, as the oracle saw it.

    Attributes:
        key: ``(phase, module, event)`` as memprof's events table names the row made at that moment.
        categories: bytes per category found by the test's hooks (``other`` and ``allocated_bytes`` are
            filled from the allocator's total once the step has run).
    """

    key: tuple[str, str, str]
    categories: dict[str, int] = field(default_factory=dict)


def storage_bytes(tensors: Iterable[Any]) -> dict[int, int]:
    """The distinct storages of ``tensors`` (non-tensors skipped): address -> bytes."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return seen


class CategoryOracle:
    """The test's own hooks on ``model`` and ``optimizer``, recording :class:`Moment` s of one step at a time.

    Args:
        model: a deterministic model (one tensor in, one tensor out per module).
        optimizer: its optimizer.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.names = {module: name for name, module in model.named_modules()}
        self.moments: list[Moment] = []
        self.inputs: dict[int, int] = {}
        self._saved: list[weakref.ref[torch.Tensor]] = []
        self._outputs: list[weakref.ref[torch.Tensor]] = []
        self._handles = [module.register_forward_hook(self._forward_exit) for module in model.modules()]
        self._handles.append(optimizer.register_step_pre_hook(lambda *_: self._moment(("optimizer", "", "enter"))))
        self._handles.append(optimizer.register_step_post_hook(lambda *_: self._moment(("optimizer", "", "exit"))))

    def remove(self) -> None:
        """Takes the hooks off."""
        for handle in self._handles:
            handle.remove()

    def run(self, step: Callable[[torch.Tensor], None], inputs: torch.Tensor) -> list[Moment]:
        """Runs ``step(inputs)`` under torch.profiler and returns its moments, allocator totals filled in."""
        from torch.profiler import ProfilerActivity, profile

        self.moments, self._saved, self._outputs = [], [], []
        self.inputs = storage_bytes([inputs])
        # The allocator does not report frees of blocks allocated before profiling: gradients left by an earlier
        # step would vanish unseen inside the window, so they go now (as the step's zero_grad would take them).
        self.model.zero_grad(set_to_none=True)
        start = sum(self._state().values()) + sum(self.inputs.values())
        gc.collect()  # the cycle collector would free earlier work inside the window (see memory_events)
        gc.disable()
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                    torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                step(inputs)
        finally:
            gc.enable()
        events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        totals, live = [], start
        for event in events:
            size = event.nbytes()
            if MARK_BYTES <= abs(size) < MARK_BYTES + _MAX_MOMENTS:
                if size > 0:
                    totals.append(live)
                continue
            live += size
        assert len(totals) == len(self.moments), "a marker block went missing: the moments cannot be placed"
        for moment, total in zip(self.moments, totals):
            known = sum(moment.categories.values())
            moment.categories["allocated_bytes"] = total
            moment.categories["other"] = total - known
        return self.moments

    # --- what lives where, read at a moment
    def _state(self) -> dict[int, int]:
        """Storages of the model's parameters, buffers, gradients and the optimizer's state."""
        return storage_bytes([*self.model.parameters(), *self.model.buffers(), *self._grads(),
                              *self._optimizer_state()])

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def _optimizer_state(self) -> list[torch.Tensor]:
        return [t for state in self.optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]

    def _alive(self, refs: list[weakref.ref[torch.Tensor]]) -> list[torch.Tensor]:
        return [t for t in (r() for r in refs) if t is not None]

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._saved.append(weakref.ref(tensor))
        return tensor

    def _moment(self, key: tuple[str, str, str], grads: Iterable[Any] = ()) -> None:
        weights = storage_bytes(self.model.parameters())
        buffers = storage_bytes(self.model.buffers())
        weight_grads = storage_bytes(self._grads())
        state = storage_bytes(self._optimizer_state())
        model_state = weights.keys() | buffers.keys() | self.inputs.keys()
        # Feature maps: what autograd saved and still holds, and the modules' outputs still alive.
        features = {p: b for p, b in storage_bytes(self._alive(self._saved + self._outputs)).items()
                    if p not in model_state}
        flowing = {p: b for p, b in storage_bytes(grads).items() if p not in features}
        self.moments.append(Moment(key, {
            "weights": sum(weights.values()), "buffers": sum(buffers.values()),
            "weight_grads": sum(weight_grads.values()), "optimizer_state": sum(state.values()),
            "inputs": sum(self.inputs.values()), "feature_maps": sum(features.values()),
            "grads": sum(flowing.values()),
            # the oracle's models train in float32 on one process: no autocast casts, no DDP buckets
            "weight_copies": 0, "comm_buffers": 0,
        }))
        marker = torch.empty(MARK_BYTES + len(self.moments) - 1, dtype=torch.uint8)
        del marker

    def _forward_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            raise TypeError("the oracle's models return one tensor per module")
        name = self.names[module]
        self._outputs.append(weakref.ref(output))
        self._moment(("forward", name, "exit"))
        if output.grad_fn is not None:
            output.grad_fn.register_prehook(lambda grads, name=name: self._moment(("backward", name, "enter"), grads))
