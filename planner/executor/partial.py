"""Partial replay of one stage: ``F_all(l)[k]`` keeps some ops' outputs and, in backward, replays only the ops
that the saved tensors it dropped depend on (a partial option, ``StageOption.partial``).

PyTorch's selective checkpoint (:mod:`planner.executor.selective`) reruns the stage's whole forward in backward,
skipping the kept ops. Here the forward runs once under a dispatch mode that records each aten op
(:class:`~planner.executor.partial_tape.PartialTape`): its arguments with every tensor replaced by a reference
(to an output of an earlier op of the stage, or to a tensor made before the stage, held strongly), the outputs
of the policy's ops, kept, and the RNG state before each random op. Under saved-tensor hooks, a saved tensor
made before the stage or kept is packed as itself (through the hooks already active, if any), any other as a
handle ``(op, output)`` that holds no tensor, so its memory goes when the forward drops it. The first tensor
the stage returns (its output, which the schedule holds anyway) is kept too, so its op is never replayed. RNG
states are kept as bytes (host memory off the tensor allocator; 5 KB for the CPU generator).

At the first unpack of one of the stage's handles in backward, one pass replays, in forward order, the union of
what every live handle depends on (:meth:`~planner.executor.partial_tape.PartialTape.cone`), so in-place ops
apply in their forward order; it restores the RNG state before each random op, and the global state after the
pass (``torch.random.fork_rng``); each replayed temporary is dropped after its last use; each handle is then
served once (a second unpack raises: backward runs once through the stage, as with the selective checkpoint),
and the kept outputs are released (autograd holds those it saved). The replay runs under ``recompute`` (the runtime freezes batch-norm statistics there), without
autograd (its tensors are saved tensors of nodes that exist already) and without autocast (the recorded ops
were already cast). A tensor the replay would need but cannot trust raises: a kept output that was changed in
place after it was made (its version counter moved), or a tensor made before the stage that a replayed op
would write into through a view; an in-place write the forward made directly into such a tensor (batch-norm
statistics) is replayed on a copy of its value before the write.

Compared with ``torch.utils.checkpoint``'s non-reentrant mode, which matches the saved tensors of the
recomputation to the forward's by the order they were packed (it replays everything up to the last one), a
handle here names the op and output it was made by, so nothing else runs.

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.executor.partial_tape import OpOut, Outside, PartialTape, set_replay_rng
from planner.executor.selective import Policy


class _RecordingMode(TorchDispatchMode):
    def __init__(self, tape: PartialTape) -> None:
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return self.tape.record(func, args, kwargs or {})


class _ReplayHandle:
    """What autograd holds for a dropped saved tensor: the op output it names, and the replayed tensor
    between the replay and its unpack."""

    __slots__ = ("ref", "value", "served", "__weakref__")

    def __init__(self, ref: tuple[int, int]) -> None:
        self.ref = ref
        self.value: torch.Tensor | None = None
        self.served = False  # handed to autograd (a handle is unpacked once)


class _OuterPacked:
    """A tensor packed as itself by the saved-tensor hooks that were active around the stage."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _PartialStage:
    """One recorded forward of a stage: its tape, its handles, and the replay that serves them."""

    def __init__(self, policy: Policy, recompute: Callable[[Callable[[], Any]], Any]) -> None:
        self.tape = PartialTape(policy)
        self.recompute = recompute
        self.handles: list[weakref.ref[_ReplayHandle]] = []
        self.outer = torch._C._autograd._top_saved_tensors_default_hooks(False)

    def pack(self, tensor: torch.Tensor) -> Any:
        ref = self.tape.producer(tensor)
        # made before the stage, kept, or a view of memory held anyway: packed as itself, as autograd would
        if ref is None or ref in self.tape.kept or self.tape.creators[ref] in self.tape.held_creators:
            return tensor if self.outer is None else _OuterPacked(self.outer[0](tensor))
        handle = _ReplayHandle(ref)
        self.handles.append(weakref.ref(handle))
        return handle

    def unpack(self, packed: Any) -> Any:
        if isinstance(packed, _OuterPacked):
            assert self.outer is not None
            return self.outer[1](packed.value)
        if not isinstance(packed, _ReplayHandle):
            return packed
        if packed.ref in self.tape.kept:  # the stage's output, kept once its forward returned
            return self.tape.kept_tensor(packed.ref)
        if packed.served:
            raise RuntimeError(
                "partial recomputation: a saved tensor of this stage was unpacked a second time; its replay runs "
                "once, like PyTorch's selective checkpoint (backward once through the stage, without retain_graph)"
            )
        if packed.value is None:
            self._replay()
        value, packed.value = packed.value, None
        packed.served = True
        return value

    def _replay(self) -> None:
        live = [h for r in self.handles if (h := r()) is not None and h.ref not in self.tape.kept and not h.served]
        needed = {h.ref for h in live}
        results = self.recompute(lambda: self._run(self.tape.cone(needed), needed))
        for handle in live:
            handle.value = results[handle.ref]
        # the kept outputs served their purpose (those autograd saved, it holds itself): freed now, as the
        # selective checkpoint frees its cache once its recomputation consumed it, not at the stage's end
        self.tape.release_kept({h.ref for r in self.handles if (h := r()) is not None})

    def _run(self, order: list[int], needed: set[tuple[int, int]]) -> dict[tuple[int, int], torch.Tensor]:
        tape = self.tape
        last: dict[tuple[int, int], int] = {ref: p for p in order for ref, _ in tape.steps[p].refs}
        held = tape.held_storages()
        results: dict[tuple[int, int], Any] = {}
        with self._replay_context(order):
            for p in order:
                step = tape.steps[p]
                if step.rng is not None:
                    set_replay_rng(step.rng)
                flat = [self._value(mark, results, position in step.written) for position, mark in enumerate(step.flat)]
                for position in step.written:
                    _refuse_held_write(flat[position], held, step.func)
                args, kwargs = tree_unflatten(flat, step.spec)
                out = step.func(*args, **kwargs)
                values = [*tree_flatten(out)[0], *(flat[position] for position in step.written)]
                for k in step.slots:
                    results[(p, k)] = values[k]
                del flat, args, kwargs, out, values
                # drop each temporary after its last reader (the handles' tensors stay)
                for ref, _ in step.refs:
                    if last.get(ref) == p and ref not in needed:
                        results.pop(ref, None)
                for k in step.slots:
                    if (p, k) not in last and (p, k) not in needed:
                        results.pop((p, k), None)
        return {ref: results[ref] for ref in needed}

    def _value(self, mark: Any, results: dict[tuple[int, int], Any], written: bool) -> Any:
        if isinstance(mark, OpOut):
            return self.tape.kept_tensor(mark.ref) if mark.ref in self.tape.kept else results[mark.ref]
        if isinstance(mark, Outside):  # written: the forward's value before its write, on a copy
            tensor = self.tape.outside[mark.index]
            return tensor.clone() if written else tensor
        return mark

    def _replay_context(self, order: list[int]) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        for device_type in ("cpu", "cuda") if self.tape.cuda else ("cpu",):
            stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        states = [self.tape.steps[p].rng for p in order if self.tape.steps[p].rng is not None]
        if states:
            devices = sorted({device for state in states if state is not None for device, _ in state[1]})
            stack.enter_context(torch.random.fork_rng(devices=devices, device_type="cuda"))
        return stack


def _refuse_held_write(value: Any, held: set[int], func: Any) -> None:
    """A replayed op may write only into tensors the replay made (or copied): never a kept or outside one."""
    if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in held:
        raise RuntimeError(
            f"partial recomputation: replaying {func} would write in place into a tensor the stage keeps or was "
            "given (a view of a kept output, a parameter or a buffer), which the forward wrote once already; "
            "run this stage with a selective option (partial=False) or without the in-place write"
        )


def run_partial(call: Callable[[torch.Tensor], Any], x: torch.Tensor, policy: Policy,
                recompute: Callable[[Callable[[], Any]], Any]) -> Any:
    """``call(x)`` keeping the outputs of ``policy``'s ops; backward replays only what the dropped saved tensors
    need.

    Args:
        call: runs the stage on its input.
        x: the stage's input (held by the replay, as the outside tensors are).
        policy: the ops whose outputs are kept: ``(aten overload name, occurrence)``, counted as
            :mod:`planner.executor.selective` counts them.
        recompute: wraps the replay (``recompute(thunk)`` runs ``thunk()`` and returns its result), e.g. to
            freeze batch-norm running statistics that the first run already updated.

    Returns:
        What ``call(x)`` returns.

    Raises:
        RuntimeError: a kept output was changed in place by the stage after it was made.
    """
    stage = _PartialStage(policy, recompute)
    with _RecordingMode(stage.tape), torch.autograd.graph.saved_tensors_hooks(stage.pack, stage.unpack):
        out = call(x)
    stage.tape.finish(out)
    return out
