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


class RMSNorm(nn.Module):
    """Root-mean-square normalisation, as Llama uses."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Rotary(nn.Module):
    """Rotary position tables ``(cos, sin)``, computed without gradients and shared by every block."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))

    @torch.no_grad()
    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.get_buffer("inv_freq")
        angles = positions[:, None].float() * inv_freq[None, :]
        both = torch.cat([angles, angles], dim=-1)
        return both.cos(), both.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class DecoderLayer(nn.Module):
    """A Llama-style block called the Hugging Face way: keyword side inputs, a tuple result.

    Grouped-query attention (fewer key/value heads than query heads), rotary embeddings, an additive
    causal mask and a SwiGLU MLP, with pre-norm residuals.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.input_layernorm = RMSNorm(dim)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.kv_proj = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.post_attention_layernorm = RMSNorm(dim)
        self.gate_up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                use_cache: bool = False) -> tuple[torch.Tensor, None]:
        batch, seq, dim = hidden_states.shape
        h = self.input_layernorm(hidden_states)
        q = self.q_proj(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(h).view(batch, seq, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if position_embeddings is not None:
            q, k = _rotate(q, *position_embeddings), _rotate(k, *position_embeddings)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        if attention_mask is not None:
            scores = scores + attention_mask
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, dim)
        hidden_states = hidden_states + self.o_proj(attended)
        gate, up = self.gate_up(self.post_attention_layernorm(hidden_states)).chunk(2, dim=-1)
        return hidden_states + self.down(nn.functional.silu(gate) * up), None


class TinyLlama(nn.Module):
    """A Llama-style language model written as Hugging Face writes them: its ``forward`` loops over an
    ``nn.ModuleList`` of blocks, passing the mask and rotary tables as keyword arguments."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 4) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.rotary_emb = Rotary(dim // heads)
        self.layers = nn.ModuleList([DecoderLayer(dim, heads, kv_heads) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        hidden_states = self.embed_tokens(input_ids)
        position_embeddings = self.rotary_emb(torch.arange(seq, device=input_ids.device))
        mask = torch.full((seq, seq), float("-inf"), device=input_ids.device).triu(1)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_embeddings=position_embeddings,
                                  use_cache=False)[0]
        return self.lm_head(self.norm(hidden_states)).flatten(0, 1)


def llama(vocab: int = 256, dim: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 4,
          seq: int = 32) -> ModelAndData:
    """A Hugging Face-style Llama (grouped-query attention, rotary tables, keyword side inputs)."""
    model = TinyLlama(vocab, dim, heads, kv_heads, layers)
    return model, lambda n: (torch.randint(0, vocab, (n, seq)), torch.randint(0, vocab, (n * seq,)))


ZOO: dict[str, Callable[[], ModelAndData]] = {
    "mlp": mlp, "cnn": cnn, "lstm": lstm, "transformer": transformer, "llama": llama,
}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, set_to_none: bool = True) -> float:
    """One ordinary training step; returns the loss."""
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=set_to_none)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
