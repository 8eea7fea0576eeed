"""Runs a rematerialization schedule on an ``nn.Sequential`` as a drop-in module.

``loss = criterion(model(x), y); loss.backward()`` then follows the schedule: the operations up to stage L
run in ``forward``, the loss (stage L+1) is whatever the user computes from the output, and the B operations
with the recomputations between them run during ``loss.backward()``. Gradients are those of plain autograd
(bitwise on CPU for deterministic operations); dropout masks are replayed; BatchNorm running statistics move
once per iteration. The runtime itself is pure torch (:mod:`planner.executor_stage`,
:mod:`planner.executor_runtime`, :mod:`planner.executor_container`); this module validates a
:class:`~planner.schedule.Schedule` and maps its stages to the container's children.

Module names: ``Stage.modules`` holds qualified names. They may be relative to the container (``"0"``,
``"3"``) or absolute with the container's path as prefix (``"features.0"``, ``"transformer.h.3"``); all
names of one schedule must share that prefix. A stage may run several consecutive children. A chain whose
stages name no modules (a hand-written chain) maps stage ``l`` to the container's ``l``-th child.

Limits: the container must be called as one module (``x = container(x)``) with one tensor in and one tensor
out between stages; parameter gradients are accumulated by nested ``torch.autograd.backward`` calls (as in
the reentrant ``torch.utils.checkpoint``), so ``torch.autograd.grad`` over the parameters is not supported
and ``retain_graph`` cannot replay the schedule twice.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from torch import nn

from planner.errors import InvalidScheduleError, ScheduleMismatchError
from planner.executor_container import ScheduledSequential, adoptable, children_of, install
from planner.executor_runtime import Program
from planner.schedule import Op, OpKind, Schedule

__all__ = ["CheckpointedSequential", "apply_schedule", "schedule_layout", "validate_ops"]


class CheckpointedSequential(ScheduledSequential):
    """An ``nn.Sequential`` that trains with a rematerialization schedule.

    Args:
        sequential: the container (an ``nn.Sequential``, an ``nn.ModuleList`` or a list of modules); its
            children are reused, not copied, and keep their names.
        schedule: a valid schedule for a chain whose stages 1..L cover the children in order.

    Raises:
        ScheduleMismatchError: the schedule's stages do not map onto the children (names or count).
        InvalidScheduleError: the operations are not a valid sequence (names the first invalid one).
    """

    def __init__(self, sequential: nn.Sequential | Sequence[nn.Module], schedule: Schedule) -> None:
        children = _children(sequential)
        groups, ops = _prepare(schedule, list(children))
        super().__init__(children, groups, ops=ops)
        self.schedule = schedule

    @classmethod
    def in_place(cls, module: nn.Sequential, schedule: Schedule) -> CheckpointedSequential:
        """Turns ``module`` itself into a ``CheckpointedSequential`` (same object, children and hooks).

        Raises:
            ScheduleMismatchError, InvalidScheduleError: as the constructor; ``module`` is then unchanged.
        """
        groups, ops = _prepare(schedule, list(_children(module)))
        cls.adopt(module, groups, ops=ops)
        module.schedule = schedule
        return module

    def extra_repr(self) -> str:
        """Shows the schedule's algorithm, budget and length in ``print(model)``."""
        return (
            f"algorithm={self.schedule.algorithm!r}, budget_bytes={self.schedule.budget_bytes}, "
            f"stages={self.schedule.chain.length}, ops={len(self.schedule.ops)}"
        )


def apply_schedule(model: nn.Module, schedule: Schedule, container: str | None = None) -> nn.Module:
    """Makes the schedule's container in ``model`` a :class:`CheckpointedSequential`, in place.

    A plain ``nn.Sequential`` container is converted in place (same object: references to it, hooks and the
    optimizer's parameters stay valid); a subclass of it is replaced by a new module sharing its children.

    Args:
        model: the model to train.
        schedule: the schedule to follow.
        container: the qualified name of the ``nn.Sequential`` to convert (``""``: the model itself). By
            default the prefix of the schedule's module names, or the model itself when they are relative.

    Returns:
        ``model`` (the returned value differs only when ``model`` is itself a subclass of ``nn.Sequential``,
        which cannot be converted in place; a warning says so).

    Raises:
        ScheduleMismatchError: no such container, it is not an ``nn.Sequential``, or its children do not
            match the schedule's stages.
    """
    prefix, _ = schedule_layout(schedule)
    if container is None:
        container = prefix or ""
    elif prefix not in (None, "", container):
        raise ScheduleMismatchError(
            f"the schedule's modules live under {prefix!r}, but container {container!r} was given"
        )
    try:
        target = model.get_submodule(container) if container else model
    except AttributeError:
        raise ScheduleMismatchError(
            f"the model has no submodule {container!r}; expected the container the schedule was made for"
        ) from None
    if not isinstance(target, nn.Sequential):
        raise ScheduleMismatchError(
            f"{container or 'the model'} is a {type(target).__name__}; expected an nn.Sequential that the model "
            "calls as one module"
        )

    def make(old: nn.Module) -> nn.Module:
        if adoptable(old):
            return CheckpointedSequential.in_place(old, schedule)
        return CheckpointedSequential(old, schedule)

    result = install(model, container, make)
    if result is not model:
        warnings.warn(
            f"the model is a {type(model).__name__}, a subclass of nn.Sequential, so it was not changed in place; "
            "train the module that apply_schedule returned",
            stacklevel=2,
        )
    return result


def schedule_layout(schedule: Schedule) -> tuple[str | None, list[list[str]] | None]:
    """The container prefix and, per stage 1..L, the child names it runs.

    Returns:
        ``(prefix, groups)``: ``prefix`` is ``""`` for names relative to the container; ``(None, None)``
        when the chain's stages name no modules (stage ``l`` is then the ``l``-th child).

    Raises:
        ScheduleMismatchError: some stages name modules and others do not, or the names have several parents.
    """
    names = [stage.modules for stage in schedule.chain.stages[:-1]]
    if not any(names):
        return None, None
    if not all(names):
        empty = [i + 1 for i, group in enumerate(names) if not group]
        raise ScheduleMismatchError(f"stages {empty} name no modules while others do; expected every stage named")
    parents = {name.rpartition(".")[0] for group in names for name in group}
    if len(parents) != 1:
        raise ScheduleMismatchError(
            f"the schedule's modules have several parents {sorted(parents)}; expected the children of one container"
        )
    return parents.pop(), [[name.rpartition(".")[2] for name in group] for group in names]


def _children(container: nn.Module | Sequence[nn.Module]) -> dict[str, nn.Module]:
    try:
        return children_of(container)
    except TypeError as exc:
        raise ScheduleMismatchError(str(exc)) from None


def _prepare(schedule: Schedule, children: list[str]) -> tuple[list[list[str]], list[tuple[str, int]]]:
    groups = _stage_groups(schedule, children)
    validate_ops(schedule.ops, schedule.chain.length)
    return groups, [(op.kind.value, op.stage) for op in schedule.ops]


def _stage_groups(schedule: Schedule, children: list[str]) -> list[list[str]]:
    length = schedule.chain.length
    _, groups = schedule_layout(schedule)
    if groups is None:
        if length != len(children):
            raise ScheduleMismatchError(
                f"the schedule has {length} stages but the container has {len(children)} children "
                f"{_short(children)}; a chain without module names maps stage l to child l"
            )
        return [[name] for name in children]
    found = [name for group in groups for name in group]
    if found != children:
        raise ScheduleMismatchError(
            f"the schedule's {length} stages run modules {_short(found)}, but the container's children are "
            f"{_short(children)}; expected the same names in the same order"
        )
    return groups


def _short(names: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"


def validate_ops(ops: Sequence[Op], length: int) -> None:
    """Checks that ``ops`` is a valid sequence (ROTOR Table 1) that the executor can run.

    Raises:
        InvalidScheduleError: naming the first operation whose inputs are not in memory, or why the loss
            (stage L+1) cannot be run by the user between ``forward`` and ``backward``.
    """
    held: set[tuple[str, int]] = {("a", 0), ("delta", length + 1)}
    for position, op in enumerate(ops):
        missing = _missing_inputs(op, held)
        if missing:
            raise InvalidScheduleError(
                f"operation {position} ({op}) needs {' and '.join(missing)}, which the schedule does not hold there"
            )
        _apply(op, held)
    if ("delta", 0) not in held:
        raise InvalidScheduleError("the schedule never computes delta^0: expected it to end with B(1)")
    try:
        Program([(op.kind.value, op.stage) for op in ops], length)
    except ValueError as exc:
        raise InvalidScheduleError(f"the executor cannot run this schedule: {exc}") from None


def _missing_inputs(op: Op, held: set[tuple[str, int]]) -> list[str]:
    stage = op.stage
    missing = []
    if ("a", stage - 1) not in held and ("abar", stage - 1) not in held:
        missing.append(f"a^{stage - 1}")
    if op.kind is OpKind.B:
        if ("abar", stage) not in held:
            missing.append(f"a-bar^{stage} (an F_all({stage}))")
        if ("delta", stage) not in held:
            missing.append(f"delta^{stage}")
    return missing


def _apply(op: Op, held: set[tuple[str, int]]) -> None:
    stage = op.stage
    if op.kind is OpKind.B:
        held -= {("abar", stage), ("delta", stage), ("a", stage - 1)}
        held.add(("delta", stage - 1))
    elif op.kind is OpKind.F_ALL:
        held.discard(("a", stage))
        held.add(("abar", stage))
    else:
        if op.kind is OpKind.F_NONE:
            held.discard(("a", stage - 1))
        held.add(("a", stage))
