"""Runs a rematerialization schedule (ROTOR Table 1 operations) on a model, inside its own ``forward``.

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling modules, which
``planner.export.files`` embeds together in the files it writes).

Each stage's first module gets a wrapper ``forward`` (:mod:`planner.executor.install`); the model's
``forward`` keeps running as written and calls the wrappers in chain order. The wrapper of stage ``l`` runs the
schedule's forward operation for ``l`` (``F_all``, ``F_ck`` or ``F_none``) through one custom autograd
function, whose backward, called by autograd with ``delta^l``, runs the schedule's operations up to ``B(l)``
(recomputations included) and hands ``delta^{l-1}`` back. Parameter gradients are accumulated by nested
``torch.autograd.backward`` calls, as in the reentrant ``torch.utils.checkpoint``. ``OFFLOAD`` and
``PREFETCH`` run where the schedule puts them (those after a stage's forward when the wrapper of that stage
returns), through :class:`planner.executor.transfers.Transfers`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from planner.executor.block_io import reshaped_input, secondary_outputs, tensors_in
from planner.executor.carried_grads import CarriedGrads
from planner.executor.grads import Recorded, backward_freeing_grad, steal
from planner.executor.partial import run_partial
from planner.executor.program import F_ALL, F_NONE, OFFLOAD, TRANSFER_KINDS, B
from planner.executor.selective import Policy, run_selective, split_option
from planner.executor.stage import (
    RngState,
    StageCall,
    autocast_context,
    autocast_state,
    capture_rng,
    replay_rng,
    same_rng,
    uncached_casts,
)
from planner.executor.transfers import Transfers


class _Run:
    """One forward call of the model: what the schedule holds between operations.

    ``acts[l]`` is a^l without history; ``recs[l]`` is (detached input, recorded output) of an F_all(l), i.e.
    a-bar^l; ``delta`` is the current gradient. Each operation is a method so its locals die when it returns.
    """

    def __init__(self, executor: Any, x: torch.Tensor) -> None:  # a ScheduleExecutor (executor_install)
        self.executor = executor
        self.program = executor.program
        self.acts: dict[int, torch.Tensor] = {}
        self.recs: dict[int, tuple[torch.Tensor, Any]] = {}  # (leaf, output or Recorded)
        self.calls: dict[int, StageCall] = {}
        self.shapes: dict[int, torch.Size] = {}
        self.delta: torch.Tensor | None = None
        self.seen: set[int] = set()
        self.rng: dict[int, RngState] = {}
        self.autocast = autocast_state(x)
        self.input_requires_grad = x.requires_grad
        self.next_stage = 1
        self.done: set[int] = set()
        self.raw: Any = None  # the first run's full result (tuple, ModelOutput), handed to the wrapper
        self.carried = CarriedGrads()  # the carried tensors' gradients, added up as plain autograd adds them
        self.secondary: dict[int, list[Recorded]] = {}  # what F_all(l) recorded its secondary outputs as
        self.secondary_grads: dict[int, tuple[torch.Tensor | None, ...]] = {}  # their gradients, for B(l)
        self.transfers = (Transfers(executor.pool, executor.copiers, executor.min_offload_bytes)
                          if self.program.offloaded else None)
        self.weights = executor.weights  # a WeightStreamer when the schedule streams weights, else None
        if self.weights is not None:
            self.weights.finish()  # an abandoned step's copies: retired; this step starts at its first computation
            self.weights.place(x.device)

    def forward(self, stage: int, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Runs stage ``stage``'s forward operation on ``x``; returns a^l (no history) and the raw result."""
        if stage > 1:
            shape = reshaped_input(stage, x, self._output(stage - 1))
            if shape is not None:
                self.shapes[stage] = shape  # the model's reshape (a flatten) between two stages
        else:
            self.acts[0] = x.detach()
        kind = self.program.forward_kinds[stage - 1]
        raw = self._forward(kind, stage)
        for transfer, index in self.program.after_forward.get(stage, ()):
            self._transfer(transfer, index)
        self.next_stage = stage + 1
        y = self._output(stage)
        if stage == self.program.length:
            if self.transfers is not None:
                self.transfers.retire_out()  # the chain's forward ends here: the loss runs without it
            # What follows the chain (head, loss) decides when a^L is freed, as in plain autograd: the schedule
            # needs no more of it than the recorded graph's gradient edge (for B(L)).
            self.acts.pop(stage, None)
            if stage in self.recs:
                leaf, out = self.recs[stage]
                self.recs[stage] = (leaf, Recorded.of(out))
        return y, raw

    def backward(self, stage: int, grad: torch.Tensor,
                 secondary: tuple[torch.Tensor | None, ...] = ()) -> torch.Tensor | None:
        """Runs the operations up to ``B(stage)`` with ``grad`` as delta^stage (``secondary``: the gradients of
        the stage's secondary outputs); returns delta^{stage-1}."""
        if stage in self.done:
            raise RuntimeError("the scheduled backward of this forward call already ran; backward(retain_graph=True) "
                               "twice through a scheduled model is not supported")
        self.done.add(stage)
        if any(g is not None for g in secondary):
            # one gradient may reach both outputs (``y + side``); delta^l's memory is freed as soon as it is used
            ptr = grad.untyped_storage().data_ptr()
            self.secondary_grads[stage] = tuple(
                g.clone() if g is not None and g.untyped_storage().data_ptr() == ptr else g for g in secondary)
        self.delta = steal(grad)
        del grad
        for kind, index in self.program.segments[stage]:
            if kind == B:
                self._backward(index)
            elif kind in TRANSFER_KINDS:
                self._transfer(kind, index)
            else:
                self._forward(kind, index)
        delta, self.delta = self.delta, None
        if stage == 1:
            self.acts.clear()
            self.recs.clear()
            self.calls.clear()
            self.carried.clear()
            self.secondary.clear()
            self.secondary_grads.clear()
            if self.transfers is not None:
                self.transfers.clear()
            if self.weights is not None:
                self.weights.finish()
        return delta

    def _transfer(self, kind: str, stage: int) -> None:
        assert self.transfers is not None, "a transfer in a program without offloads"
        if kind == OFFLOAD:
            self.transfers.offload(stage)
        else:
            self.transfers.prefetch(stage)

    def _output(self, stage: int) -> torch.Tensor:
        return (self.acts[stage] if stage in self.acts else self.recs[stage][1]).detach()

    def _input(self, stage: int) -> torch.Tensor:
        if stage - 1 in self.acts:
            x = self.acts[stage - 1]
        elif stage - 1 in self.recs:
            x = self.recs[stage - 1][1].detach()
        else:
            raise RuntimeError(f"F({stage}) needs a^{stage - 1}, which the schedule does not hold")
        return x.reshape(self.shapes[stage]) if stage in self.shapes else x

    def _forward(self, kind: str, stage: int) -> Any:
        if self.weights is None:
            return self._run_forward(kind, stage)
        self.weights.enter(stage, backward=False)
        raw = self._run_forward(kind, stage)
        self.weights.leave(stage, backward=False)
        return raw

    def _run_forward(self, kind: str, stage: int) -> Any:
        kind, option = split_option(kind)
        policy = self.executor.policies[(stage, option)] if option else None
        partial = (stage, option) in self.executor.partial
        x = self._input(stage)
        keep = kind != F_NONE or stage - 1 in self.recs
        first = stage not in self.seen
        if kind == F_ALL:
            leaf = x.detach()
            if leaf.is_floating_point() and (stage > 1 or self.input_requires_grad):
                leaf.requires_grad_(True)
            hooks = self._saved_hooks(stage, leaf)
            with torch.enable_grad(), hooks:
                # Through a view, the gradients of the stage's input are summed in autograd's buffer and handed
                # over once, as in plain autograd; on the leaf itself, its first part would be copied and kept.
                y, raw = self._call(stage, leaf.view_as(leaf) if leaf.requires_grad else leaf, keep, policy, partial)
            if self.transfers is not None and stage in self.program.offloaded:
                self.transfers.recorded(stage, [y, *tensors_in(raw if first else None)])
            self.recs[stage] = (leaf, y)
            self.secondary[stage] = [Recorded.of(t) for t in secondary_outputs(raw)]
            self.acts.pop(stage, None)
        else:
            with torch.no_grad(), uncached_casts(self.autocast):
                y, raw = self._call(stage, x, keep)
            if kind == F_NONE:
                self.acts.pop(stage - 1, None)
            self.acts[stage] = y
        return raw if first else None

    def _saved_hooks(self, stage: int, x: torch.Tensor) -> Any:
        """Where stage ``stage`` records its saved tensors: a stash when the schedule offloads it; streamed
        parameters as references to them when it streams the stage's weights."""
        streamed = self.weights is not None and stage in self.weights.params
        if self.transfers is None or stage not in self.program.offloaded:
            if not streamed:
                return contextlib.nullcontext()
            assert self.weights is not None
            return torch.autograd.graph.saved_tensors_hooks(*self.weights.hooks(None))
        call = self.calls[stage]
        others = [t for value in (*call.args, *call.kwargs.values()) for t in tensors_in(value)]
        wrap = self.weights.hooks if streamed and self.weights is not None else None
        return self.transfers.recording(stage, x, self.executor.stages[stage - 1].modules, others, wrap)

    def _call(self, stage: int, x: torch.Tensor, keep: bool, policy: Policy | None = None,
              partial: bool = False) -> tuple[torch.Tensor, Any]:
        plain = runner = self.executor.stages[stage - 1]
        if policy is not None:  # F_all with an option: keeps part, recomputes the rest (all of it, or what is needed)
            run_option = run_partial if partial else run_selective

            def frozen(thunk: Any) -> Any:
                with plain.frozen_state(unseen=True):
                    return thunk()

            def runner(inp: torch.Tensor, call: Any, leaves: Any) -> Any:
                return run_option(lambda v: plain(v, call, leaves), inp, policy, frozen)
        call = self.calls[stage]
        version = x._version
        leaves = None
        if call.carried and torch.is_grad_enabled():  # a recording: the carried inputs' gradients are wanted
            leaves = self.carried.views(stage, [_carried_value(where, call) for where in call.carried])
        if stage not in self.seen:
            self.seen.add(stage)
            before = capture_rng(x) if stage in self.program.replayed else None
            y, raw = runner(x, call, leaves)
            if before is not None and not same_rng(before, capture_rng(x)):
                self.rng[stage] = before  # kept only for stages that draw random numbers (dropout)
        else:
            with replay_rng(self.rng.get(stage), x), plain.frozen_state(), autocast_context(self.autocast):
                y, raw = runner(x, call, leaves)
        if keep and x._version != version:
            raise RuntimeError(
                f"stage {stage} modified its input in place, which the schedule keeps for later; "
                "use out-of-place operations at the start of the stage or group it with the previous stage"
            )
        return y, raw

    def _backward(self, stage: int) -> None:
        if self.weights is None:
            self._run_backward(stage)
            return
        self.weights.enter(stage, backward=True)
        self._run_backward(stage)
        self.weights.leave(stage, backward=True)

    def _secondary_roots(self, stage: int) -> list[tuple[Any, torch.Tensor]]:
        """(root, gradient) of each secondary output of stage ``stage`` that a later computation used."""
        recorded, grads = self.secondary.pop(stage, ()), self.secondary_grads.pop(stage, ())
        return [(r.root, g.reshape(r.shape)) for r, g in zip(recorded, grads) if r.root is not None and g is not None]

    def _run_backward(self, stage: int) -> None:
        if self.transfers is not None:
            self.transfers.before_backward(stage)
        leaf, out = self.recs.pop(stage)
        delta, self.delta = self.delta, None
        assert delta is not None, f"B({stage}) ran before the gradient of its output arrived"
        self.acts.pop(stage - 1, None)  # B(l) consumes a^{l-1}
        recorded = out if isinstance(out, Recorded) else Recorded.of(out)
        del out  # with a gradient edge as root, autograd frees a-bar^l as soon as it is used, as in plain
        extra = self._secondary_roots(stage) + self.carried.seeds(stage)
        if recorded.root is not None:
            # delta^l is shaped as the next stage received a^l (a view between stages may reshape it)
            root_grad = delta.reshape(recorded.shape)
            del delta
            backward_freeing_grad(recorded.root, root_grad, extra)
        else:
            del delta
            if extra:
                torch.autograd.backward([r for r, _ in extra], [g for _, g in extra])
        del extra
        grad = leaf.grad if leaf.requires_grad else None
        if grad is None and stage > 1:
            grad = torch.zeros_like(leaf)  # the stage's output does not depend on its input
        self.delta = grad
        if self.carried.hand_over(stage):
            self.calls[stage].release()  # nothing runs this stage again: its carried inputs may go
        if self.transfers is not None:
            self.transfers.done(stage)


def _carried_value(where: int | str, call: StageCall) -> torch.Tensor:
    """Carried input ``where`` of ``call`` (:meth:`CarriedGrads.views` reads it without its history)."""
    value = call.args[where] if isinstance(where, int) else call.kwargs[where]
    assert isinstance(value, torch.Tensor), "a carried input was released before its stage's last recording"
    return value


class _StageFunction(torch.autograd.Function):
    """Stage ``l``'s forward operation; its backward runs the schedule up to ``B(l)``."""

    @staticmethod
    def forward(ctx, run: _Run, stage: int, x: torch.Tensor, dummy: torch.Tensor,
                *carried: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.run, ctx.stage, ctx.input_shape, ctx.carried = run, stage, x.shape, len(carried)
        y, run.raw = run.forward(stage, x)
        # secondary outputs (T5's position bias) leave through the function, so their gradients reach B(l)
        secondary = [t.detach() for t in secondary_outputs(run.raw)] if run.raw is not None else []
        ctx.output = (y.shape, y.dtype, y.device)
        ctx.set_materialize_grads(False)  # an unused secondary output costs no backward of zeros
        return (y, *secondary)

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None, *secondary: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "a model trained with a memprof schedule supports loss.backward() only: torch.autograd.grad and "
                "backward(inputs=...) cannot run its recomputations (parameter gradients are accumulated by "
                "nested backward calls); remove the schedule (remove_schedule(model)) for this computation"
            )
        run = ctx.run
        if run is None:
            raise RuntimeError("the scheduled backward of this forward call already ran (retain_graph?)")
        if grad is None:
            shape, dtype, device = ctx.output
            grad = torch.zeros(shape, dtype=dtype, device=device)
        delta = run.backward(ctx.stage, grad, secondary)
        ctx.run = None
        carried = run.carried.take(ctx.stage, ctx.carried)
        if delta is not None and ctx.needs_input_grad[2]:
            return None, None, delta.reshape(ctx.input_shape), None, *carried
        return None, None, None, None, *carried
