"""Evidence, taken on the test's side, that a schedule really ran on a model.

A schedule that was never applied, or an executor that was never installed, leaves the model training as plain
autograd. Its gradients are then the reference's and its peak is store-all's, which for store-all itself (and,
within a loose tolerance, for many schedules) is also the prediction: the memory checks alone cannot tell.
:class:`ScheduleProbe` adds two observations the executor cannot fake by doing nothing:

* every call of each stage's own ``forward`` is counted (the probe wraps it before the schedule is applied, so
  the executor keeps calling the wrapper as the stage's forward): a step runs stage ``l``'s forward once per
  ``F_all``, ``F_ck`` or ``F_none`` of it in the schedule, recomputations included;
* each training forward of a stage hands the model an output made by the executor's autograd function
  (``planner.executor.runtime._StageFunction``, whose backward runs the schedule), seen by a forward hook.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
from torch import nn

from planner.executor import stage_modules
from planner.executor.block_io import first_tensor
from planner.executor.runtime import _StageFunction
from planner.model.schedule import OpKind, Schedule

_FORWARD_KINDS = (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE)
EXECUTOR_NODE = f"{_StageFunction.__name__}Backward"


def forward_calls_per_step(schedule: Schedule) -> list[int]:
    """How many times one step runs each stage's forward (stages 1..L): its forward operations in the schedule,
    plus one for each ``F_all`` with a selective option, whose ``B(l)`` reruns the stage's forward under the
    checkpoint (a partial option replays its ops without calling the forward)."""
    counts = Counter(op.stage for op in schedule.ops if op.kind in _FORWARD_KINDS)
    counts.update(op.stage for op in schedule.ops
                  if op.kind is OpKind.F_ALL and op.option and op.stage <= schedule.chain.length
                  and not schedule.chain.stage(op.stage).options[op.option - 1].partial)
    return [counts[stage] for stage in range(1, schedule.chain.length + 1)]


class ScheduleProbe:
    """Counts each stage's forward calls and records which autograd node made its outputs.

    Create it on the model *before* ``apply_schedule`` (or ``measure_schedule``), which then wraps the probe's
    counting forward like any other.

    Args:
        model: the model.
        schedule: the schedule about to be applied (its stages are found in ``model`` as the executor finds them).
        container: as for ``apply_schedule``.
    """

    def __init__(self, model: nn.Module, schedule: Schedule, container: str | None = None) -> None:
        self.schedule = schedule
        self.firsts = [group[0] for group in stage_modules(model, schedule, container)]
        self.calls = [0] * len(self.firsts)
        self.nodes: list[list[str]] = [[] for _ in self.firsts]
        self._wrappers: list[Any] = []
        self._handles = []
        for index, module in enumerate(self.firsts):
            wrapper = self._counting(module.forward, index)
            module.forward = wrapper
            self._wrappers.append(wrapper)
            self._handles.append(module.register_forward_hook(functools.partial(self._made_by, index)))

    def _counting(self, forward: Any, index: int) -> Any:
        @functools.wraps(forward)  # keeps the signature the executor may read
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[index] += 1
            return forward(*args, **kwargs)
        return counted

    def _made_by(self, index: int, module: nn.Module, args: Any, output: Any) -> None:
        out = first_tensor(output)
        if module.training and torch.is_grad_enabled() and out is not None and out.grad_fn is not None:
            self.nodes[index].append(type(out.grad_fn).__name__)

    def reset(self) -> None:
        """Forgets what was seen so far (e.g. a reference step run before the schedule was applied)."""
        self.calls = [0] * len(self.firsts)
        self.nodes = [[] for _ in self.firsts]

    def remove(self) -> None:
        """Takes the probe off (``remove_schedule`` drops the wrapped forwards already; this is idempotent)."""
        for handle in self._handles:
            handle.remove()
        for module, wrapper in zip(self.firsts, self._wrappers):
            if module.__dict__.get("forward") is wrapper:
                del module.forward

    def assert_ran(self, steps: int) -> None:
        """Asserts that ``steps`` training steps ran the schedule: the executor made every stage's output, and
        each stage's forward ran as often as the schedule's forward operations say (recomputations included)."""
        expected = [steps * n for n in forward_calls_per_step(self.schedule)]
        assert self.calls == expected, f"forward calls per stage {self.calls}, the schedule's {expected}"
        made = [set(nodes) for nodes in self.nodes]
        assert all(m == {EXECUTOR_NODE} for m in made), f"stage outputs made by {made}, not the executor"
