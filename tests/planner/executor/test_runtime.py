"""What the runtime runs: each stage as often as the schedule says, grouped children, in-place modules,
tuple outputs, blocks called in a loop, and the uses of autograd it refuses."""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest
import torch
from torch import nn

from planner.executor import CheckpointedSequential, apply_schedule, stage_modules
from planner.model.schedule import Op
from tests.planner import models as M
from tests.planner.executor.helpers import assert_same_step, run_step


def test_each_stage_runs_exactly_as_often_as_the_schedule_says() -> None:
    # Recomputations call a stage module's own forward (not through its hooks): count its inner layer's calls.
    model = nn.Sequential(*[nn.Sequential(layer) for layer in M.mlp(width=5, depth=4)])
    ops = M.with_wasted_recomputations(M.revolve(len(model)), random.Random(2), 4)
    scheduled = CheckpointedSequential(model, M.schedule(ops, M.chain(len(model))))
    calls: Counter[int] = Counter()
    for index, child in enumerate(scheduled):
        child[0].register_forward_hook(lambda *_, index=index: calls.update([index + 1]))
    loss = scheduled(torch.randn(3, 5)).sum()
    expected = Counter(op.stage for op in ops if op.kind is not M.B and op.stage <= len(model))
    forward_part = Counter(calls)
    loss.backward()
    assert calls == expected
    assert max(expected.values()) >= 3  # revolve recomputes some stages twice or more
    assert all(count >= 1 for count in forward_part.values()) and len(forward_part) == len(model)


def test_stages_may_group_consecutive_children() -> None:
    model = M.mlp(width=4, depth=3)
    groups = [["0", "1"], ["2", "3", "4"], ["5"]]
    schedule = M.schedule(M.revolve(3), M.chain(3, groups))
    x = torch.randn(2, 4)
    reference = run_step(model, x, lambda out: out.sum())
    scheduled = CheckpointedSequential(copy.deepcopy(model), schedule)
    groups = stage_modules(scheduled, schedule)
    assert [[id(m) for m in g] for g in groups] == [[id(scheduled[int(n)]) for n in g] for g in (("0", "1"), ("2", "3", "4"), ("5",))]
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.sum()))


def test_backward_twice_with_retain_graph_is_refused() -> None:
    model = M.mlp(width=4, depth=2)
    scheduled = CheckpointedSequential(model, M.schedule(M.revolve(len(model)), M.chain(len(model))))
    loss = scheduled(torch.randn(2, 4)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already ran"):
        loss.backward()


def test_autograd_grad_through_a_scheduled_model_is_refused() -> None:
    model = M.mlp(width=4, depth=2)
    scheduled = CheckpointedSequential(model, M.schedule(M.revolve(len(model)), M.chain(len(model))))
    x = torch.randn(2, 4, requires_grad=True)
    loss = scheduled(x).sum()
    with pytest.raises(RuntimeError, match=r"loss\.backward\(\) only"):
        torch.autograd.grad(loss, [x])


class _AddOneInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


def test_a_stage_that_overwrites_a_kept_input_is_reported() -> None:
    model = nn.Sequential(nn.Linear(3, 3), _AddOneInPlace(), nn.Linear(3, 3))
    ops = [Op(M.A, 1), Op(M.CK, 2), Op(M.A, 3), Op(M.A, 4), Op(M.B, 4), Op(M.B, 3), Op(M.A, 2), Op(M.B, 2),
           Op(M.B, 1)]
    scheduled = CheckpointedSequential(model, M.schedule(ops, M.chain(3)))
    with pytest.raises(RuntimeError, match="stage 2 modified its input in place"):
        scheduled(torch.randn(2, 3))


def test_in_place_modules_at_a_stage_start_work_on_a_copy() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 3), nn.ReLU(inplace=True))
    x = torch.randn(2, 3)
    reference = run_step(model, x, lambda out: out.sum())
    for ops in (M.store_all(4), M.revolve(4), M.periodic(4, 1)):
        scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(ops, M.chain(4)))
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.sum()))


class _Pair(nn.Module):
    """Returns ``(output, side)``: the first tensor is the activation, the second comes back detached."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.tanh(self.linear(x))
        return y, y * 2


class _PairNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([_Pair() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x, side = block(x)
        return x + side


class _Biased(nn.Module):
    """A T5-style block: the first computes a trainable bias, returns it, and every later one reads it."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.bias = nn.Parameter(torch.randn(3)) if first else None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if bias is None:
            assert self.bias is not None
            bias = self.bias * 2
        return torch.tanh(self.linear(x) + bias), bias


class _BiasNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([_Biased(i == 0) for i in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None
        for block in self.blocks:
            x, bias = block(x, bias)
        return x


@pytest.mark.parametrize("net", [_PairNet, _BiasNet])
def test_gradients_flow_through_a_stages_secondary_outputs(net: type[nn.Module]) -> None:
    model = net()
    x = torch.randn(2, 3)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = M.chain(4, [[f"blocks.{i}"] for i in range(4)])
    for ops in (M.store_all(4), M.revolve(4), M.with_wasted_recomputations(M.revolve(4), random.Random(1), 3)):
        scheduled = apply_schedule(copy.deepcopy(model), M.schedule(ops, chain))
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))
        torch.manual_seed(0)
        y, side = scheduled.blocks[0](torch.randn(2, 3, requires_grad=True))
        assert y.requires_grad and side.requires_grad


@pytest.mark.parametrize("same_tensor_twice", [False, True])
def test_a_tensor_carried_into_every_block_gets_plain_autograds_gradient(same_tensor_twice: bool) -> None:
    """The context's gradient is the sum of ten parts (two per block); added in another grouping (each
    block's pair first) its float rounding differs from plain autograd's, which this random data shows."""
    model = M.CrossModel(same_tensor_twice)
    x = torch.randn(16, 8)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = M.chain(5, [[f"blocks.{i}"] for i in range(5)])
    for ops in (M.store_all(5), M.revolve(5), M.with_wasted_recomputations(M.revolve(5), random.Random(2), 3)):
        scheduled = apply_schedule(copy.deepcopy(model), M.schedule(ops, chain))
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))


def test_a_model_calling_its_blocks_in_a_loop_with_keyword_arguments() -> None:
    model = M.LoopModel()
    x = torch.randn(5, 6)
    reference = run_step(model, x, lambda out: out.square().mean())
    chain = M.chain(4, [[f"blocks.{i}"] for i in range(4)])
    for ops in (M.store_all(4), M.periodic(4, 2), M.revolve(4), M.random_persistent(4, random.Random(3))):
        scheduled = apply_schedule(copy.deepcopy(model), M.schedule(ops, chain))
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().mean()))
    relative = M.schedule(M.revolve(4), M.chain(4, [[str(i)] for i in range(4)]))
    scheduled = apply_schedule(copy.deepcopy(model), relative, container="blocks")
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().mean()))
    unnamed = apply_schedule(copy.deepcopy(model), M.schedule(M.revolve(4), M.chain(4)), container="blocks")
    assert_same_step(reference, run_step(unnamed, x, lambda out: out.square().mean()))



class _Between(nn.Module):
    """Four blocks with the model's own computation between the first two (``between``)."""

    def __init__(self, between: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.between = between

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index == 0:
                x = x * 0.5 if self.between == "scale" else x.t()
        return x


@pytest.mark.parametrize("between", ["scale", "transpose"])
def test_a_computation_between_two_stages_is_refused_not_skipped(between: str) -> None:
    model = _Between(between)
    chain = M.chain(4, [[f"blocks.{i}"] for i in range(4)])
    scheduled = apply_schedule(copy.deepcopy(model), M.schedule(M.revolve(4), chain))
    message = "other than stage 1's output" if between == "scale" else "reshapes between stages only"
    with pytest.raises(RuntimeError, match=message):
        scheduled(torch.randn(4, 4, requires_grad=True)).sum().backward()
