"""The executor's gradients are plain autograd's, bit for bit: RNG, BatchNorm, accumulation, autocast."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from planner.executor import CheckpointedSequential, apply_schedule
from tests.planner import models as M
from tests.planner.executor.helpers import (
    CASES,
    SCHEDULES,
    assert_same_step,
    chain_for,
    cnn_case,
    run_step,
    stochastic_net,
)


@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_plain_autograd_bitwise(case: str, schedule_name: str) -> None:
    model, container, x, loss_fn, prefix = CASES[case]()
    reference = run_step(model, x, loss_fn)
    rng_after_reference = torch.get_rng_state()
    length = len(container)
    schedule = M.schedule(SCHEDULES[schedule_name](length), chain_for(container, prefix))
    scheduled = apply_schedule(copy.deepcopy(model), schedule)
    assert_same_step(reference, run_step(scheduled, x, loss_fn))
    assert torch.equal(torch.get_rng_state(), rng_after_reference)  # recomputations do not draw numbers


def test_training_steps_keep_batchnorm_statistics_and_dropout_masks() -> None:
    model, _, x, _, _ = cnn_case()
    before = int(model.features[1].num_batches_tracked)
    scheduled = apply_schedule(copy.deepcopy(model), M.schedule(M.revolve(len(model.features)),
                                                                chain_for(model.features, "features.")))
    assert type(scheduled.features) is nn.Sequential  # changed in place, not replaced
    assert "forward" in scheduled.features[0].__dict__ and "forward" not in model.features[0].__dict__
    states = []
    for net in (model, scheduled):
        torch.manual_seed(5)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(4):
            batch = torch.randn(3, 3, 6, 6)
            target = torch.randint(0, 3, (3,))
            optimizer.zero_grad()
            loss = F.cross_entropy(net(batch), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        states.append((losses, net.state_dict(), torch.get_rng_state()))
    (plain_losses, plain_state, plain_rng), (losses, state, rng) = states
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert list(plain_state) == list(state)  # the container keeps its children's names
    for key, value in plain_state.items():
        assert torch.equal(value, state[key]), key
    assert int(state["features.1.num_batches_tracked"]) == before + 4  # once per step, not per recomputation
    assert torch.equal(plain_rng, rng)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), wasted=st.integers(0, 8))
def test_any_valid_schedule_gives_plain_gradients(seed: int, wasted: int) -> None:
    model = stochastic_net()
    length = len(model)
    rng = random.Random(seed)
    ops = M.with_wasted_recomputations(M.random_persistent(length, rng), rng, wasted)
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(seed))
    scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(ops, M.chain(length)))
    reference = run_step(model, x, lambda out: out.square().mean(), seed)
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().mean(), seed))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(model[2], name), getattr(scheduled[2], name))


def test_gradient_accumulation_over_two_forwards() -> None:
    model = stochastic_net()
    scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(M.revolve(len(model)), M.chain(len(model))))
    first, second = torch.randn(4, 3, 4), torch.randn(4, 3, 4)
    grads = []
    for net in (model, scheduled):
        torch.manual_seed(0)
        net.zero_grad(set_to_none=True)
        (net(first).sum() + 2 * net(second).sum()).backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_eval_mode_and_no_grad_just_run_the_layers() -> None:
    model = stochastic_net()
    scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(M.revolve(len(model)), M.chain(len(model))))
    x = torch.randn(4, 3, 4)
    with torch.no_grad():
        torch.manual_seed(0)
        expected = model(x)
        torch.manual_seed(0)
        found = scheduled(x)
    assert torch.equal(expected, found) and not found.requires_grad
    model.eval()
    scheduled.eval()
    assert torch.equal(model(x), scheduled(x))
    assert int(scheduled[2].num_batches_tracked) == 1


def test_recomputations_in_backward_reuse_the_forward_autocast() -> None:
    model = M.mlp(width=8, depth=3)
    x = torch.randn(4, 8)
    schedule = M.schedule(M.revolve(len(model)), M.chain(len(model)))
    scheduled = CheckpointedSequential(copy.deepcopy(model), schedule)
    grads = []
    for net in (model, scheduled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(x)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))

