"""Factories for ``memprof estimate`` tests: ``FACTORY(batch_size) -> (model, batch, loss_fn)``, and broken ones."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from examples import zoo


def _cross_entropy(model: nn.Module, batch: tuple) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def tiny_gpt(batch_size: int) -> tuple:
    """A GPT-style model built on the meta device, its batch given as meta tensors (shapes only)."""
    with torch.device("meta"):
        model = zoo.TinyGPT(vocab=128, dim=32, heads=2, layers=4, seq=16)
    tokens = torch.empty(batch_size, 16, dtype=torch.long, device="meta")
    return model, (tokens, torch.empty(batch_size * 16, dtype=torch.long, device="meta")), _cross_entropy


def raises(batch_size: int) -> tuple:
    raise ValueError(f"no model for batch {batch_size}")


def returns_a_model(batch_size: int) -> nn.Module:
    return nn.Linear(4, 4)


def wrong_shapes(batch_size: int) -> tuple:
    return nn.Linear(4, 4), (torch.randn(batch_size, 5), torch.zeros(batch_size, dtype=torch.long)), _cross_entropy


def data_dependent(batch_size: int) -> tuple:
    model = nn.Linear(4, 4)
    return model, torch.randn(batch_size, 4), lambda m, x: m(x)[m(x) > 0].sum()


not_callable = 3


class _ReturnsACache(nn.Module):
    """Returns a key/value cache beside its output, as a Hugging Face model with ``use_cache=True`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> dict:
        keys, values = self.proj(x).chunk(2, dim=-1)
        return {"logits": keys * values, "past_key_values": ((keys.contiguous(), values.contiguous()),)}


def returns_a_cache(batch_size: int) -> tuple:
    """A model whose cache is two ``batch_size x 16`` float32 storages: 128 B per sample."""
    with torch.device("meta"):
        model = _ReturnsACache()
    return model, torch.empty(batch_size, 16, device="meta"), lambda m, x: m(x)["logits"].sum()
