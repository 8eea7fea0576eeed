"""Small example models, sized for a CPU, used by the tests, the benchmarks and ``memprof demo``.

Each builder returns ``(model, make_batch)`` where ``make_batch(batch_size)`` returns ``(inputs, targets)``
for ``torch.nn.functional.cross_entropy(model(inputs), targets)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
ModelAndData = tuple[nn.Module, Callable[[int], Batch]]


def mlp(blocks: int = 4, width: int = 256, in_features: int = 128, classes: int = 10) -> ModelAndData:
    """A plain ``nn.Sequential`` MLP: Linear + ReLU blocks and a classifier."""
    layers: list[nn.Module] = [nn.Linear(in_features, width), nn.ReLU()]
    for _ in range(blocks - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    model = nn.Sequential(*layers)
    return model, lambda n: (torch.randn(n, in_features), torch.randint(0, classes, (n,)))


class ConvBlock(nn.Sequential):
    """Conv, BatchNorm, in-place ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    """A ResNet basic block: two convolutions with BatchNorm and a skip connection."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvBlock(channels, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn2(self.conv2(self.conv1(x))) + x)


def cnn(channels: int = 16, blocks: int = 4, image: int = 32, classes: int = 10, dropout: float = 0.1) -> ModelAndData:
    """A ResNet-style CNN with BatchNorm, in-place ReLU and dropout; ``model.features`` is the chain."""
    model = nn.Sequential()
    model.add_module("stem", ConvBlock(3, channels))
    model.add_module("features", nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)]))
    model.add_module("pool", nn.AdaptiveAvgPool2d(1))
    model.add_module("flatten", nn.Flatten())
    model.add_module("dropout", nn.Dropout(dropout))
    model.add_module("head", nn.Linear(channels, classes))
    return model, lambda n: (torch.randn(n, 3, image, image), torch.randint(0, classes, (n,)))


class LSTMClassifier(nn.Module):
    """Embedding, a two-layer LSTM (tuple outputs with hidden states) and a classifier."""

    def __init__(self, vocab: int = 500, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, (h, _c) = self.lstm(self.embed(tokens))
        return self.head(out[:, -1] + h[-1])


def lstm(vocab: int = 500, hidden: int = 64, seq: int = 16, classes: int = 10) -> ModelAndData:
    """An LSTM classifier over random token sequences."""
    model = LSTMClassifier(vocab, hidden, classes)
    return model, lambda n: (torch.randint(0, vocab, (n, seq)), torch.randint(0, classes, (n,)))


class Block(nn.Module):
    """A pre-norm transformer block (multi-head attention + MLP) with residuals."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        attended, _weights = self.attn(h, h, h, need_weights=False)
        x = x + attended
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style language model: token + position embeddings, a block stack ``h``, tied output head."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 4, seq: int = 32,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.h = nn.Sequential(*[Block(dim, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one storage, counted once

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.ln(self.h(x))).flatten(0, 1)


def transformer(vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 4, seq: int = 32) -> ModelAndData:
    """A GPT-style stack with tied embeddings; targets are next tokens, flattened."""
    model = TinyGPT(vocab, dim, heads, layers, seq)
    return model, lambda n: (torch.randint(0, vocab, (n, seq)), torch.randint(0, vocab, (n * seq,)))


ZOO: dict[str, Callable[[], ModelAndData]] = {"mlp": mlp, "cnn": cnn, "lstm": lstm, "transformer": transformer}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, set_to_none: bool = True) -> float:
    """One ordinary training step; returns the loss."""
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=set_to_none)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
