"""Models, schedules and a bitwise comparison of training steps shared by the executor's tests."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.nn import functional as F

from planner.model.chain import Chain
from tests.planner import models as M

#: Schedules for a chain of n stages, by name: the textbook ones, a random one and one wasting recomputations.
SCHEDULES = {
    "store_all": M.store_all,
    "periodic": lambda n: M.periodic(n, 2),
    "revolve": M.revolve,
    "random": lambda n: M.random_persistent(n, random.Random(n)),
    "wasted": lambda n: M.with_wasted_recomputations(M.revolve(n), random.Random(n), 6),
}


def run_step(model: nn.Module, x: torch.Tensor, loss_fn, seed: int = 0) -> tuple[torch.Tensor, list, torch.Tensor]:
    """One forward/backward from a fixed RNG state: (loss, parameter grads, input grad or None)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    x = x.detach().requires_grad_() if x.is_floating_point() else x
    loss = loss_fn(model(x))
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], (x.grad if x.is_floating_point() else None)


def assert_same_step(reference, got) -> None:
    """Two :func:`run_step` results are bitwise equal: loss, every parameter gradient, the input gradient."""
    assert torch.equal(reference[0], got[0])
    assert len(reference[1]) == len(got[1])
    for expected, found in zip(reference[1], got[1]):
        assert expected is not None and found is not None
        assert torch.equal(expected, found)
    if reference[2] is not None:
        assert torch.equal(reference[2], got[2])


def chain_for(container: nn.Sequential, prefix: str = "") -> Chain:
    """A chain of one stage per child of ``container``, naming them ``prefix + name``."""
    names = [[f"{prefix}{name}"] for name, _ in container.named_children()]
    return M.chain(len(names), names)


def mlp_case():
    """``(model, container, input, loss function, name prefix)`` of an MLP; the other cases alike."""
    model = M.mlp(width=6, depth=3)
    return model, model, torch.randn(4, 6), lambda out: out.pow(2).sum(), ""


def cnn_case():
    model = M.CNN()
    model.train()
    x = torch.randn(2, 3, 6, 6)
    model(x)  # materialises the lazy head
    target = torch.tensor([0, 2])
    return model, model.features, x, lambda out: F.cross_entropy(out, target), "features."


def transformer_case():
    model = M.transformer()
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(3))
    target = torch.randint(0, 11, (10,), generator=torch.Generator().manual_seed(4))
    return model, model, ids, lambda out: F.cross_entropy(out.flatten(0, 1), target), ""


#: The models the gradients are checked on.
CASES = {"mlp": mlp_case, "cnn": cnn_case, "transformer": transformer_case}


def stochastic_net() -> nn.Sequential:
    """A small net with BatchNorm, an in-place ReLU and dropout, the same weights each call."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Dropout(0.5),
        nn.Linear(8, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 3),
    )

