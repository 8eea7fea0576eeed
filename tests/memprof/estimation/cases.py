"""Models, batches and optimizers an estimate is checked on, and the allocator's truth to check it against.

Each case builds a model, a batch and a loss the way its users train it: the zoo's MLP, ResNet-style CNN
(BatchNorm, in-place ReLU, dropout), GPT-style transformer (tied embeddings) and Llama-style model; Hugging
Face GPT-2, BERT and Llama built from small configs (random weights, nothing downloaded); and a model
written here with in-place operations, views and tied weights. The measured peak of a step comes from
torch.profiler's allocator events (the allocator's own report, not memprof's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from examples import zoo
from tests.allocator_truth import allocator_rise_bytes

Loss = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class Case:
    """A model to estimate: ``build()`` returns ``(model, batch, loss_fn)`` (seeded)."""

    name: str
    build: Callable[[], tuple[nn.Module, Any, Loss]]


def _cross_entropy(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def _zoo(name: str, batch_size: int, **kwargs: Any) -> Callable[[], tuple[nn.Module, Any, Loss]]:
    def build() -> tuple[nn.Module, Any, Loss]:
        torch.manual_seed(0)
        model, make_batch = zoo.ZOO[name](**kwargs)
        return model, make_batch(batch_size), _cross_entropy
    return build


def _hugging_face(name: str, batch_size: int) -> Callable[[], tuple[nn.Module, Any, Loss]]:
    def build() -> tuple[nn.Module, Any, Loss]:
        from tests.planner.real_models import ALL_BUILDERS

        real = ALL_BUILDERS[name]()
        return real.model, real.make_batch(batch_size), real.loss
    return build


class TiedViews(nn.Module):
    """In-place operations, views and tied weights: an embedding tied to the output projection, a weight
    shared by two layers, in-place activations and residual adds, and views (``view``, ``transpose``,
    slicing, ``chunk``) of activations that autograd saves."""

    def __init__(self, vocab: int = 300, dim: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.a = nn.Linear(dim, 2 * dim)
        self.b = nn.Linear(dim, dim)
        self.c = nn.Linear(dim, dim)
        self.c.weight = self.b.weight  # shared by two layers
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight  # tied embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (n, s, d)
        gate, value = self.a(x).chunk(2, dim=-1)  # views of one output
        h = torch.sigmoid(gate) * value
        h = h.transpose(0, 1).contiguous().transpose(0, 1)  # a copy behind two views
        h = self.b(h)
        h += x  # an in-place residual, on an output nothing saved
        h = F.relu_(h)  # in place; relu saves its result
        h = self.c(h[:, 1:])  # a slice (a view) into the layer sharing b's weight
        h.mul_(0.5)
        return self.out(self.norm(h)).reshape(-1, self.out.out_features)


def _tied_views(batch_size: int) -> Callable[[], tuple[nn.Module, Any, Loss]]:
    def build() -> tuple[nn.Module, Any, Loss]:
        torch.manual_seed(0)
        model = TiedViews()
        tokens = torch.randint(0, 300, (batch_size, 24))
        return model, (tokens, torch.randint(0, 300, (batch_size * 23,))), _cross_entropy
    return build


CASES: dict[str, Case] = {case.name: case for case in [
    Case("mlp", _zoo("mlp", 64)),
    Case("cnn", _zoo("cnn", 16)),
    Case("transformer", _zoo("transformer", 16)),
    Case("llama_style", _zoo("llama", 16)),
    Case("gpt2", _hugging_face("gpt2", 8)),
    Case("bert", _hugging_face("bert", 8)),
    Case("llama", _hugging_face("llama", 8)),
    Case("tied_views", _tied_views(16)),
]}

#: Optimizer factories by name: SGD with momentum (it keeps state), Adam, AdamW, each foreach and not.
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=False),
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    found = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(found.values())


def train_step(model: nn.Module, batch: Any, loss_fn: Loss, optimizer: torch.optim.Optimizer | None) -> None:
    """The step an estimate runs: zero the gradients (to None), loss, backward, optimizer step."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    if optimizer is not None:
        optimizer.step()


def measured_peak(model: nn.Module, batch: Any, loss_fn: Loss,
                  make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None) -> int:
    """The allocator's peak of a steady-state CPU step: what is allocated when it starts (model and
    optimizer state, the batch) plus the highest rise of torch.profiler's allocation events during it."""
    optimizer = make_optimizer(list(model.parameters())) if make_optimizer is not None else None
    train_step(model, batch, loss_fn, optimizer)  # the optimizer's state exists, as in the estimate's step
    model.zero_grad(set_to_none=True)  # frees of blocks allocated before profiling are not reported
    state = [t for s in (optimizer.state.values() if optimizer is not None else []) for t in _tensors(s)]
    start = _storage_bytes([*model.parameters(), *model.buffers(), *state, *_tensors(batch)])
    return start + allocator_rise_bytes(lambda: train_step(model, batch, loss_fn, optimizer))
