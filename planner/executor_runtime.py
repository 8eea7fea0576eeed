"""Runs a rematerialization schedule (ROTOR Table 1 operations) across ``forward`` and ``backward``.

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling modules, which
``planner.export`` embeds together in the files it writes).

Two ways to run a schedule:

* ``ops`` (any valid sequence): the operations up to the output of stage L run in ``forward``; the loss
  (stage L+1) is the user's; the rest (the B operations and the recomputations between them) runs inside
  ``loss.backward()``, driven by two custom autograd functions. The first receives delta^L from autograd and
  stops after B(L), so that autograd frees delta^L as the cost model assumes; the second runs everything
  else and hands delta^0 back to autograd.
* ``plan`` (persistent schedules): a nested list such as ``[[1, [2, 3]], 4]`` where an integer runs a stage
  and a nested list is one ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` segment.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from planner.executor_stage import (
    RngState,
    StageRunner,
    autocast_context,
    autocast_state,
    capture_rng,
    replay_rng,
    same_rng,
)

F_ALL, F_CK, F_NONE, B = "F_all", "F_ck", "F_none", "B"
FORWARD_KINDS = (F_ALL, F_CK, F_NONE)


class Program:
    """A schedule's operations split into the part run in ``forward`` and the two backward parts.

    Args:
        ops: ``(kind, stage)`` pairs, stages 1..L+1, stage L+1 being the loss.
        length: L, the number of stages without the loss.

    Raises:
        ValueError: the loss is not run exactly as F_all(L+1) ... B(L+1), or B(L) is missing.
    """

    def __init__(self, ops: Sequence[tuple[str, int]], length: int) -> None:
        ops = [(str(kind), int(stage)) for kind, stage in ops]
        top = length + 1
        loss_ops = [(i, kind) for i, (kind, stage) in enumerate(ops) if stage == top]
        if [kind for _, kind in loss_ops] != [F_ALL, B]:
            raise ValueError(
                f"the loss (stage {top}) must appear as F_all({top}) then B({top}), found "
                f"{[f'{kind}({top})' for _, kind in loss_ops]}"
            )
        start, end = loss_ops[0][0], loss_ops[1][0]
        middle = ops[start + 1 : end]
        if any(kind == B for kind, _ in middle):
            raise ValueError(f"no B operation can run between F_all({top}) and B({top})")
        # F operations between the loss's forward and backward commute with B(L+1): run them after it.
        backward = middle + ops[end + 1 :]
        if (B, length) not in backward:
            raise ValueError(f"the schedule never runs B({length})")
        split = backward.index((B, length)) + 1
        self.length = length
        self.forward_ops = tuple(ops[:start])
        self.top_ops = tuple(backward[:split])
        self.rest_ops = tuple(backward[split:])
        counts: dict[int, int] = {}
        for kind, stage in ops:
            if kind in FORWARD_KINDS:
                counts[stage] = counts.get(stage, 0) + 1
        self.replayed = frozenset(stage for stage, count in counts.items() if count > 1)


class _Run:
    """The state of one forward call: what the schedule holds in memory between operations.

    ``acts[l]`` is a^l without history; ``recs[l]`` is (detached input, recorded output) of an F_all(l), i.e.
    a-bar^l; ``delta`` is the current gradient. Each operation is a method so its locals die when it returns.
    """

    def __init__(self, stages: Sequence[StageRunner], program: Program, x: torch.Tensor) -> None:
        self.stages = stages
        self.program = program
        self.acts: dict[int, torch.Tensor] = {0: x.detach()}
        self.recs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.delta: torch.Tensor | None = None
        self.seen: set[int] = set()
        self.rng: dict[int, RngState] = {}
        self.autocast = autocast_state(x)
        self.input_requires_grad = x.requires_grad
        self.finished = False

    def run(self, ops: Sequence[tuple[str, int]]) -> None:
        for kind, stage in ops:
            if kind == B:
                self._backward(stage)
            else:
                self._forward(kind, stage)

    def output(self) -> torch.Tensor:
        last = self.program.length
        return (self.acts[last] if last in self.acts else self.recs[last][1]).detach()

    def backward_top(self, grad: torch.Tensor) -> None:
        if self.finished or self.delta is not None:
            raise RuntimeError(
                "a scheduled backward already ran for this forward call; backward(retain_graph=True) "
                "twice through a checkpointed sequence is not supported"
            )
        self.acts.pop(self.program.length, None)  # B(L+1) consumed a^L
        self.delta = grad
        self.run(self.program.top_ops)

    def backward_rest(self) -> torch.Tensor | None:
        self.run(self.program.rest_ops)
        delta, self.delta = self.delta, None
        self.acts.clear()
        self.recs.clear()
        self.finished = True
        return delta

    def _input(self, stage: int) -> torch.Tensor:
        if stage - 1 in self.acts:
            return self.acts[stage - 1]
        if stage - 1 in self.recs:
            return self.recs[stage - 1][1].detach()
        raise RuntimeError(f"F({stage}) needs a^{stage - 1}, which the schedule does not hold")

    def _forward(self, kind: str, stage: int) -> None:
        x = self._input(stage)
        keep = kind != F_NONE or stage - 1 in self.recs
        if kind == F_ALL:
            leaf = x.detach()
            if leaf.is_floating_point() and (stage > 1 or self.input_requires_grad):
                leaf.requires_grad_(True)
            with torch.enable_grad():
                y = self._call(stage, leaf, keep)
            self.recs[stage] = (leaf, y)
            self.acts.pop(stage, None)
        else:
            with torch.no_grad():
                y = self._call(stage, x, keep)
            if kind == F_NONE:
                self.acts.pop(stage - 1, None)
            self.acts[stage] = y

    def _call(self, stage: int, x: torch.Tensor, keep: bool) -> torch.Tensor:
        runner = self.stages[stage - 1]
        version = x._version
        if stage not in self.seen:
            self.seen.add(stage)
            before = capture_rng(x) if stage in self.program.replayed else None
            y = runner(x)
            if before is not None and not same_rng(before, capture_rng(x)):
                self.rng[stage] = before  # kept only for stages that draw random numbers (dropout)
        else:
            with replay_rng(self.rng.get(stage), x), runner.frozen_state(), autocast_context(self.autocast):
                y = runner(x)
        if keep and x._version != version:
            raise RuntimeError(
                f"stage {stage} modified its input in place, which the schedule keeps for later; "
                "use out-of-place operations at the start of the stage or group it with the previous stage"
            )
        return y

    def _backward(self, stage: int) -> None:
        leaf, out = self.recs.pop(stage)
        delta, self.delta = self.delta, None
        self.acts.pop(stage - 1, None)  # B(l) consumes a^{l-1}
        if out.requires_grad:
            root = _root(out)
            del out  # with a gradient edge as root, autograd frees a-bar^l as soon as it is used, as in plain
            torch.autograd.backward(root, delta)
        grad = leaf.grad if leaf.requires_grad else None
        if grad is None and stage > 1:
            grad = torch.zeros_like(leaf)  # the stage's output does not depend on its input
        self.delta = grad


def _root(out: torch.Tensor) -> object:
    get_edge = getattr(torch.autograd.graph, "get_gradient_edge", None)  # torch >= 2.4
    if out.grad_fn is None or get_edge is None:
        return out
    return get_edge(out)


class _Start(torch.autograd.Function):
    """Runs the forward part; its backward runs the operations after B(L) and returns delta^0."""

    @staticmethod
    def forward(ctx, run: _Run, x: torch.Tensor, dummy: torch.Tensor) -> torch.Tensor:
        ctx.run = run
        run.run(run.program.forward_ops)
        return torch.zeros((), dtype=torch.float32, device=x.device)

    @staticmethod
    def backward(ctx, token_grad: torch.Tensor) -> tuple[None, torch.Tensor | None, None]:
        run, ctx.run = ctx.run, None
        if run is None:
            raise RuntimeError("the scheduled backward of this forward call already ran (retain_graph?)")
        delta = run.backward_rest()
        return None, delta if ctx.needs_input_grad[1] else None, None


class _Finish(torch.autograd.Function):
    """Hands a^L to the user; its backward receives delta^L and runs the operations up to B(L)."""

    @staticmethod
    def forward(ctx, run: _Run, token: torch.Tensor) -> torch.Tensor:
        ctx.run = run
        ctx.token_device = token.device  # a^L may live on another device than the chain's input
        return run.output()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        run, ctx.run = ctx.run, None
        if run is None:
            raise RuntimeError("the scheduled backward of this forward call already ran (retain_graph?)")
        run.backward_top(grad)
        return None, torch.zeros((), dtype=torch.float32, device=ctx.token_device)


def run_ops(stages: Sequence[StageRunner], program: Program, x: torch.Tensor) -> torch.Tensor:
    """Runs ``program`` on ``x``: the forward part now, the rest during ``backward``."""
    run = _Run(stages, program, x)
    dummy = torch.empty(0, requires_grad=True)  # makes the output require grad even when x does not
    token = _Start.apply(run, x, dummy)
    return _Finish.apply(run, token)


def run_plan(stages: Sequence[StageRunner], plan: Sequence, x: torch.Tensor) -> torch.Tensor:
    """Runs a nested checkpoint plan (integers: stages 1..L; lists: checkpointed segments)."""
    return _run_plan(stages, plan, x, set())


def _run_plan(stages: Sequence[StageRunner], plan: Sequence, x: torch.Tensor, seen: set[int]) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    for item in plan:
        if isinstance(item, int):
            x = _plan_stage(stages, item, x, seen)
        else:
            x = checkpoint(_run_plan, stages, item, x, seen, use_reentrant=False)
    return x


def _plan_stage(stages: Sequence[StageRunner], index: int, x: torch.Tensor, seen: set[int]) -> torch.Tensor:
    runner = stages[index - 1]
    if index not in seen:  # torch.utils.checkpoint replays RNG itself; only the buffers need care
        seen.add(index)
        return runner(x)
    with runner.frozen_state():
        return runner(x)


def plan_stages(plan: Sequence) -> list[int]:
    """The stages a nested plan runs, in order (must be 1..L)."""
    out: list[int] = []
    for item in plan:
        out.extend([item] if isinstance(item, int) else plan_stages(item))
    return out
