"""Applies a rematerialization schedule to a model in place, wherever its chain's blocks live.

``apply_schedule(model, schedule)`` wraps each stage's first module where it lives (``module.forward`` is
replaced on that instance only); the model's own ``forward`` keeps running, with its loops, keyword
arguments and tuple or ``ModelOutput`` results. ``loss.backward()`` then follows the schedule: the B
operations and the recomputations between them run as autograd reaches each stage. Gradients are those of
plain autograd (bitwise on CPU for deterministic operations); dropout masks are replayed; BatchNorm running
statistics move once per step. The runtime itself is pure torch (:mod:`planner.executor.stage`,
:mod:`planner.executor.runtime`, :mod:`planner.executor.install`); this module validates a :class:`~planner.model.schedule.Schedule` through the
simulator (the one copy of the operations' memory rules) and finds its modules in the model.

Module names: ``Stage.modules`` holds qualified names in the model (``"transformer.h.3"``,
``"layer1.0"``). A chain whose stages name no modules (a hand-written chain) maps stage ``l`` to the
``l``-th child of ``container`` (an ``nn.Sequential`` or ``nn.ModuleList``, the model by default).

A schedule planned from a trace knows its model (``Chain.signature``): :func:`apply_schedule` compares the
model with it first (:mod:`planner.executor.model_check`) and refuses another one (deeper, shallower, wider,
another dtype or class) in one line; with ``strict=False`` it applies a model of the same blocks and containers
(wider, narrower, another dtype) with a warning that its memory prediction does not hold, and still refuses one
whose blocks differ (a deeper model's extra blocks would train wrongly). At run time, a training forward whose
stage-1 input is not the size planned for (another batch or sequence length) gets one warning.

Limits: the chain's blocks must be called once each, in order, in every training forward, and receive the
running activation as a tensor argument; side inputs (masks, position tables) must not require grad; only
``loss.backward()`` is supported (``torch.autograd.grad`` and a second backward raise a clear error).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memprof.capture.regional import compile_settings
from planner.errors import InvalidScheduleError, ScheduleMismatchError
from planner.executor.chunked_head import install_chunked_head, remove_chunked_head
from planner.executor.embedding_grad import install_embedding_grads, remove_embedding_grads
from planner.executor.install import ScheduleExecutor
from planner.executor.model_check import check_model, find_module, unwatch_input, watch_input
from planner.executor.offload import MIN_OFFLOAD_BYTES
from planner.executor.program import Program
from planner.executor.selective import policy_of, with_option
from planner.model.schedule import Op, Schedule
from planner.simulation.simulator import simulate

__all__ = ["CheckpointedSequential", "apply_schedule", "remove_schedule", "stage_modules", "validate_ops"]

_ATTRIBUTE = "_memprof_schedule"


def apply_schedule(model: nn.Module, schedule: Schedule, container: str | None = None,
                   min_offload_bytes: int = MIN_OFFLOAD_BYTES,
                   optimizer: torch.optim.Optimizer | None = None, strict: bool = True,
                   compile: Any = None) -> nn.Module:  # noqa: A002 -- torch.compile's word
    """Makes ``model`` train with ``schedule``, in place (the same object, parameters and hooks).

    Args:
        model: the model the schedule's chain was found in (or an equal copy of it).
        schedule: the schedule to follow; a previous one on this model is removed first.
        container: for a chain whose stages name no modules, the ``nn.Sequential`` whose children are the
            stages (``""``: the model itself); also accepted as a prefix of relative module names.
        min_offload_bytes: with ``OFFLOAD`` operations, saved storages smaller than this stay on the device.
        optimizer: with streamed weights, the optimizer that steps the model: its state follows the streamed
            parameters to host memory before each step and back to the device on :func:`remove_schedule`
            (without it, an optimizer that already holds state on the device refuses the host parameters).
        strict: refuse a model that differs from the one the schedule was planned for (its chain's signature);
            ``False``: apply it anyway with one warning (its memory prediction does not hold), unless its blocks
            differ (a stage module missing, a container's children other than planned).
        compile: run each stage's modules as compiled regions (:func:`planner.executor.install.compiled_forwards`),
            as they ran in the trace the schedule was planned from: ``True`` with inductor, a ``torch.compile``
            backend (a name or a callable: the one the profiled model was compiled with) with it, ``False``
            eagerly. ``None`` (default): ``model``'s own backend when it is ``torch.compile``'d, inductor when the
            chain was costed from a compiled model's trace (``Chain.source["compiled"]``), else eagerly.

    Returns:
        ``model``.

    Raises:
        ScheduleMismatchError: the model is not the one the schedule was planned for (one line: what differs), a
            module the schedule names is not in the model, or the stages do not map.
        InvalidScheduleError: the operations are not valid (names the first invalid one) or cannot be run
            inside the model's forward; ``model`` is compiled with ``fullgraph=True`` and a stage runs between
            graph breaks (any but the plain ends, :func:`planner.executor.program.plain_ends`); the stages are to run
            compiled and an operation runs eagerly only (see :func:`planner.executor.install.refuse_eager_only`).
    """
    validate_ops(schedule.ops, schedule.chain.length, schedule)
    check_planned_model(model, schedule, container, strict)
    groups = stage_modules(model, schedule, container)
    remove_schedule(model)
    chunks, eager = loss_chunks(schedule)
    try:
        executor = ScheduleExecutor(groups, runtime_ops(schedule), min_offload_bytes, policies(schedule),
                                    schedule.streamed_weights, root=model, partial=partial_options(schedule),
                                    compiled=runs_compiled(model, schedule, compile, chunks))
    except ValueError as exc:
        raise InvalidScheduleError(str(exc)) from None
    if getattr(getattr(model, "dynamo_ctx", None), "fullgraph", False) and executor.modules:
        raise InvalidScheduleError(f"this model is compiled with fullgraph=True, which allows no graph break, and "
                                   f"{len(executor.modules)} stage(s) of this schedule run between compiled graphs "
                                   "(those it recomputes and the ones between them); compile it without fullgraph "
                                   "(its stages still run compiled)")
    try:
        executor.install()
        if chunks:
            install_chunked_head(model, chunks=chunks, eager=eager)
    except ValueError as exc:
        executor.remove()
        raise ScheduleMismatchError(str(exc)) from None
    install_embedding_grads(model)  # no dense embedding gradient beside an existing .grad (embedding_grad.py)
    if optimizer is not None:
        executor.follow(optimizer)
    signature = schedule.chain.signature
    if signature is not None:
        watch_input(model, groups[0][0], signature.input_bytes, schedule.chain.stages[0].modules[0])
    object.__setattr__(model, _ATTRIBUTE, (executor, schedule))
    return model


def runs_compiled(model: nn.Module, schedule: Schedule, compile: Any, chunks: int) -> Any:  # noqa: A002
    """How the schedule's stages run: ``False`` (eagerly), ``True`` (inductor) or a backend (see
    :func:`apply_schedule`'s ``compile``).

    Raises:
        InvalidScheduleError: compiled stages with a chunked loss (its head runs eagerly only).
    """
    if compile is None and type(model).__name__ == "OptimizedModule":
        compile = compile_settings(model)[0]  # the backend (mode, options) the model was compiled with
    elif compile is None:
        compile = bool(schedule.chain.source.get("compiled"))
    if compile is not False and chunks:
        raise InvalidScheduleError("this schedule computes the loss in chunks, which runs eagerly only, and its stages "
                                   "are to run compiled; plan it with --no-loss-options, or apply it with "
                                   "compile=False")
    return compile


def check_planned_model(model: nn.Module, schedule: Schedule, container: str | None, strict: bool) -> None:
    """Checks ``model`` against the model the schedule's chain was found in (see :func:`apply_schedule`).

    A chain planned from a trace without a signature (JSON written before it existed) cannot be checked: one
    warning says so. A hand-written chain has nothing to check (a positional one is checked by its container's
    children, :func:`stage_modules`).

    Raises:
        ScheduleMismatchError: as :func:`planner.executor.model_check.check_model` says.
    """
    signature = schedule.chain.signature
    if signature is None:
        if schedule.chain.source.get("run_id") and all(stage.modules for stage in schedule.chain.stages[:-1]):
            warnings.warn(f"this schedule's chain (run {schedule.chain.source['run_id']}) carries no model signature "
                          "(planned before schedules recorded one), so it cannot be checked against this model; "
                          "re-plan to have it checked", UserWarning, stacklevel=3)
        return
    try:
        check_model(model, signature.to_dict(), container or "", strict, stacklevel=4)
    except ValueError as exc:
        raise ScheduleMismatchError(str(exc)) from None


def runtime_ops(schedule: Schedule) -> list[tuple[str, int]]:
    """The schedule's operations as the runtime takes them (``"F_all[k]"`` for a recomputation option).

    The loss stage's option is not the runtime's: the model's own forward runs the loss, and a chunked loss
    is installed on its head instead (:func:`loss_chunks`).
    """
    top = schedule.chain.length + 1
    return [(with_option(op.kind.value, op.option if op.stage != top else 0), op.stage) for op in schedule.ops]


def loss_chunks(schedule: Schedule) -> tuple[int, bool]:
    """The chunks the schedule's loss option computes the head and loss in (0: the loss runs as written), and
    whether it computes their gradients in the forward (``eager``).

    Raises:
        InvalidScheduleError: the loss stage is recorded with an option that is not a chunked loss.
    """
    top = schedule.chain.length + 1
    chosen = {op.option for op in schedule.ops if op.stage == top and op.option}
    if not chosen:
        return 0, False
    if len(chosen) > 1:
        raise InvalidScheduleError(f"the loss stage is recorded with options {sorted(chosen)}; expected one option")
    option = schedule.chain.stage(top).options[chosen.pop() - 1]
    if not option.chunks:
        raise InvalidScheduleError(f"the loss stage's option {option.name!r} is not a chunked loss (chunks=0); the "
                                   "executor can only run the loss as written or in chunks")
    return option.chunks, option.eager


def policies(schedule: Schedule) -> dict[tuple[int, int], tuple[tuple[str, int], ...]]:
    """For each ``(stage, option)`` the schedule uses, the ops the option keeps (name, occurrence)."""
    out = {}
    for op in schedule.ops:
        if op.option and op.stage <= schedule.chain.length:  # the loss's option: loss_chunks
            option = schedule.chain.stage(op.stage).options[op.option - 1]
            if option.saves and len(option.save_occurrences) != len(option.saves):
                raise InvalidScheduleError(
                    f"{op}: option {option.name!r} names its kept ops without their occurrences (save_occurrences); "
                    "re-plan from a trace recorded with ops=True"
                )
            out[(op.stage, op.option)] = policy_of(option.save_ops, option.save_occurrences)
    return out


def partial_options(schedule: Schedule) -> list[tuple[int, int]]:
    """The ``(stage, option)`` pairs the schedule uses whose option is partial (replays only what it needs)."""
    used = {(op.stage, op.option) for op in schedule.ops if op.option and op.stage <= schedule.chain.length}
    return sorted((stage, option) for stage, option in used
                  if schedule.chain.stage(stage).options[option - 1].partial)


def remove_schedule(model: nn.Module) -> nn.Module:
    """Gives the model back its own forward everywhere (a no-op on a model without a schedule)."""
    installed = model.__dict__.pop(_ATTRIBUTE, None)
    if installed is not None:
        installed[0].remove()
    unwatch_input(model)
    remove_chunked_head(model)
    remove_embedding_grads(model)
    return model


def stage_modules(model: nn.Module, schedule: Schedule, container: str | None = None) -> list[list[nn.Module]]:
    """The modules of each stage 1..L, found in ``model``.

    Raises:
        ScheduleMismatchError: a name is missing from the model, a module appears twice, or (for a chain
            without names) the container's children do not match the stages.
    """
    names = [stage.modules for stage in schedule.chain.stages[:-1]]
    if not any(names):
        return [[child] for child in _positional(model, container, schedule.chain.length)]
    if not all(names):
        empty = [i + 1 for i, group in enumerate(names) if not group]
        raise ScheduleMismatchError(f"stages {empty} name no modules while others do; expected every stage named")
    groups = [[_find(model, name, container) for name in group] for group in names]
    flat = [id(m) for g in groups for m in g]
    if len(set(flat)) != len(flat):
        raise ScheduleMismatchError("the schedule names one module in two places; expected each module once")
    return groups


def _find(model: nn.Module, name: str, container: str | None) -> nn.Module:
    # as the name is, under the container, or with or without a wrapper's prefix (model_check.module_candidates)
    found = find_module(model, name, container)
    if found is not None:
        return found[1]
    raise ScheduleMismatchError(
        f"the model has no module {name!r} (a {type(model).__name__}); expected the model the schedule's chain "
        "was found in, with the same module names"
    )


def _positional(model: nn.Module, container: str | None, length: int) -> list[nn.Module]:
    try:
        target = model.get_submodule(container) if container else model
    except AttributeError:
        raise ScheduleMismatchError(f"the model has no submodule {container!r}") from None
    if not isinstance(target, (nn.Sequential, nn.ModuleList)):
        raise ScheduleMismatchError(
            f"the schedule's stages name no modules, so stage l is the l-th child of {container or 'the model'}, "
            f"which must be an nn.Sequential; found a {type(target).__name__}"
        )
    children = list(target.children())
    if len(children) != length:
        raise ScheduleMismatchError(
            f"the schedule has {length} stages but {container or 'the model'} has {len(children)} children; "
            "a chain without module names maps stage l to child l"
        )
    return children


def validate_ops(ops: Sequence[Op], length: int, schedule: Schedule | None = None) -> None:
    """Checks that ``ops`` is a valid sequence and that the executor can run it in a model's forward.

    Validity is the simulator's (ROTOR Table 1, one copy of the rules); the executor adds that the forward
    part runs stages 1..L once each, in order, as a model's ``forward`` calls them.

    Raises:
        InvalidScheduleError: naming the first invalid operation, or why the executor cannot run it.
    """
    if schedule is not None:
        simulate(schedule.chain, schedule)
    else:
        from planner.model.chain import Chain, Stage

        placeholder = Chain("ops", 0, tuple(Stage(0.0, 0.0, 0, 0, 0) for _ in range(length + 1)))
        simulate(placeholder, list(ops))
    try:
        Program([(op.kind.value, op.stage) for op in ops], length)
    except ValueError as exc:
        raise InvalidScheduleError(f"the executor cannot run this schedule: {exc}") from None


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` that trains with a rematerialization schedule (its children are the stages).

    Args:
        sequential: the container (an ``nn.Sequential``, an ``nn.ModuleList`` or a list of modules); its
            children are reused, not copied, and keep their names.
        schedule: a valid schedule whose stages name the children (relative names) or no modules.
        min_offload_bytes: as :func:`apply_schedule`.

    Raises:
        ScheduleMismatchError, InvalidScheduleError: as :func:`apply_schedule`.
    """

    def __init__(self, sequential: nn.Module | Sequence[nn.Module], schedule: Schedule,
                 min_offload_bytes: int = MIN_OFFLOAD_BYTES) -> None:
        if isinstance(sequential, nn.Module):
            children = dict(sequential.named_children())
        else:
            children = {str(i): m for i, m in enumerate(sequential)}
        super().__init__()
        for name, module in children.items():
            self.add_module(name, module)
        self.schedule = schedule
        prefix = _relative_prefix(schedule)
        apply_schedule(self, _relative(schedule, prefix), min_offload_bytes=min_offload_bytes)

    def extra_repr(self) -> str:
        """Shows the schedule's algorithm, budget and length in ``print(model)``."""
        return (
            f"algorithm={self.schedule.algorithm!r}, budget_bytes={self.schedule.budget_bytes}, "
            f"stages={self.schedule.chain.length}, ops={len(self.schedule.ops)}"
        )


def _relative_prefix(schedule: Schedule) -> str:
    names = [name for stage in schedule.chain.stages[:-1] for name in stage.modules]
    parents = {name.rpartition(".")[0] for name in names}
    return parents.pop() if len(parents) == 1 else ""


def _relative(schedule: Schedule, prefix: str) -> Schedule:
    if not prefix:
        return schedule
    from dataclasses import replace

    stages = tuple(replace(s, modules=tuple(m[len(prefix) + 1 :] for m in s.modules)) for s in schedule.chain.stages)
    signature = schedule.chain.signature.relative_to(prefix) if schedule.chain.signature is not None else None
    return replace(schedule, chain=replace(schedule.chain, stages=stages, signature=signature))
