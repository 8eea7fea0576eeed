"""Factories for ``memprof profile-ops`` tests: ``FACTORY(batch_size) -> (model, batch, loss_fn)`` on the CPU."""

from __future__ import annotations

import torch
from torch import nn


def mlp(batch_size: int) -> tuple:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.randn(batch_size, 8), lambda m, x: m(x).square().mean()


def blocks(batch_size: int) -> tuple:
    """Four residual-free MLP blocks (linear, GELU, linear): each has recomputation options."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(4)))
    return model, torch.randn(batch_size, 32), lambda m, x: m(x).square().mean()


def on_meta(batch_size: int) -> tuple:
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    return model, torch.empty(batch_size, 4, device="meta"), lambda m, x: m(x).sum()


def step_raises(batch_size: int) -> tuple:
    return nn.Linear(4, 4), torch.randn(batch_size, 5), lambda m, x: m(x).sum()


def never_calls_the_model(batch_size: int) -> tuple:
    model = nn.Linear(4, 4)
    return model, torch.randn(batch_size, 4), lambda m, x: (x @ m.weight).sum()
