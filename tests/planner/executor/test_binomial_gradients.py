"""A binomial schedule executed on a 30-layer net gives plain autograd's gradients, bit for bit."""

from __future__ import annotations

import copy

import torch
from torch import nn

from planner.executor import apply_schedule
from planner.model.schedule import OpKind
from planner.solvers.binomial import memory_bounds
from planner.solvers.dispatch import solve
from tests.planner.executor.helpers import assert_same_step, chain_for, run_step


def tiny_net(layers: int = 30) -> nn.Sequential:
    """``layers`` small children: Linear, Tanh and Dropout in turn (dropout checks the RNG replay)."""
    torch.manual_seed(2)
    kinds = [lambda: nn.Linear(5, 5), nn.Tanh, lambda: nn.Dropout(0.1)]
    return nn.Sequential(*[kinds[i % 3]() for i in range(layers)])


def test_binomial_schedule_gradients_equal_plain_autograd_bitwise() -> None:
    model = tiny_net()
    chain = chain_for(model)
    schedule = solve(chain, int(memory_bounds(chain)[4]), "binomial")
    assert schedule.params.snapshots == 4
    recomputed = sum(op.kind is not OpKind.B for op in schedule.ops) - (chain.length + 1)
    assert recomputed > 2 * chain.length  # four snapshots over 31 steps: each stage advanced several times
    x = torch.randn(3, 5)
    loss_fn = lambda out: out.pow(2).sum()  # noqa: E731
    reference = run_step(model, x, loss_fn)
    rng_after_reference = torch.get_rng_state()
    scheduled = apply_schedule(copy.deepcopy(model), schedule)
    assert_same_step(reference, run_step(scheduled, x, loss_fn))
    assert torch.equal(torch.get_rng_state(), rng_after_reference)
