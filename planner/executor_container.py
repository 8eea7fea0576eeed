"""``ScheduledSequential``: an ``nn.Sequential`` that trains with a schedule, and how to install it.

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling modules, which
``planner.export`` embeds together in the files it writes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from planner.executor_runtime import Program, plan_stages, run_ops, run_plan
from planner.executor_stage import StageRunner


class ScheduledSequential(nn.Sequential):
    """An ``nn.Sequential`` whose training forward/backward follows a schedule.

    Children keep their names (state dicts are unchanged). In eval mode, under ``no_grad`` or when nothing
    needs a gradient, the children just run in order.

    Args:
        children: the container's children by name, in order.
        groups: for each stage 1..L, the names of the consecutive children it runs.
        ops: the schedule's ``(kind, stage)`` operations (any valid sequence), or
        plan: a nested checkpoint plan (persistent schedules); exactly one of ``ops`` and ``plan``.
    """

    def __init__(
        self,
        children: Mapping[str, nn.Module],
        groups: Sequence[Sequence[str]],
        ops: Sequence[tuple[str, int]] | None = None,
        plan: Sequence | None = None,
    ) -> None:
        super().__init__(OrderedDict(children))
        self._configure(*_checked(list(self._modules), groups, ops, plan))

    @classmethod
    def adopt(
        cls,
        module: nn.Sequential,
        groups: Sequence[Sequence[str]],
        ops: Sequence[tuple[str, int]] | None = None,
        plan: Sequence | None = None,
    ) -> ScheduledSequential:
        """Turns ``module`` itself into a scheduled sequence: same object, children, hooks and references."""
        config = _checked(list(module._modules), groups, ops, plan)
        module.__class__ = cls
        module._configure(*config)
        return module

    def _configure(self, groups: tuple, program: Program | None, plan: Sequence | None) -> None:
        self.stage_groups = groups
        self.program = program
        self.plan = plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Runs the schedule's forward part when training with gradients, else the children in order."""
        if not self.training or not torch.is_grad_enabled() or not self._needs_grad(x):
            return super().forward(x)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"a scheduled sequence takes one tensor, found {type(x).__name__}")
        stages = [StageRunner([self._modules[name] for name in group]) for group in self.stage_groups]
        if self.plan is not None:
            return run_plan(stages, self.plan, x)
        return run_ops(stages, self.program, x)

    def _needs_grad(self, x: object) -> bool:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
        return any(p.requires_grad for p in self.parameters())


def _checked(names: list[str], groups: Sequence[Sequence[str]], ops: Sequence[tuple[str, int]] | None,
             plan: Sequence | None) -> tuple[tuple, Program | None, Sequence | None]:
    flat = [name for group in groups for name in group]
    if flat != names:
        raise ValueError(f"stages must cover the children {names} in order, found {flat}")
    if (ops is None) == (plan is None):
        raise ValueError("give exactly one of ops and plan")
    if plan is not None and plan_stages(plan) != list(range(1, len(groups) + 1)):
        raise ValueError(f"a plan must run stages 1..{len(groups)} once each, found {plan_stages(plan)}")
    program = Program(ops, len(groups)) if ops is not None else None
    return tuple(tuple(group) for group in groups), program, plan


def adoptable(module: nn.Module) -> bool:
    """Whether ``module`` can become a scheduled sequence in place (a plain or already scheduled Sequential)."""
    return type(module) is nn.Sequential or isinstance(module, ScheduledSequential)


def install(model: nn.Module, container: str, make: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Puts ``make(target)`` where the submodule ``container`` (``""``: the model) was.

    ``make`` may return ``target`` itself, converted in place (see :meth:`ScheduledSequential.adopt`).

    Returns:
        ``model``; or the new module when the model itself had to be replaced by another object.
    """
    target = model.get_submodule(container) if container else model
    new = make(target)
    if new is target:
        return model
    if not container:
        return new
    parent_name, _, child = container.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return model


def children_of(container: nn.Module | Sequence[nn.Module]) -> dict[str, nn.Module]:
    """The named children of a sequential container or of a plain list of modules."""
    if isinstance(container, nn.Module):
        if not isinstance(container, (nn.Sequential, nn.ModuleList)):
            raise TypeError(
                f"the container must be an nn.Sequential (called as one module), found {type(container).__name__}"
            )
        return dict(container.named_children())
    return {str(i): module for i, module in enumerate(container)}
