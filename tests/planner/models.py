"""Tiny models and hand-made schedules for the executor and export tests (each runs in milliseconds)."""

from __future__ import annotations

import random

import torch
from torch import nn

from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule

A, CK, NONE, B = OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE, OpKind.B


def mlp(width: int = 8, depth: int = 4, seed: int = 0) -> nn.Sequential:
    """Linear/ReLU pairs: ``2 * depth`` children named "0".."2*depth-1"."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class CNN(nn.Module):
    """A chain of conv blocks (BatchNorm, in-place ReLU, dropout) under ``features``, then a head."""

    def __init__(self, channels: int = 4, blocks: int = 3, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1)]
        for _ in range(blocks):
            layers += [
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
                nn.Dropout(0.3),
                nn.Conv2d(channels, channels, 3, padding=1),
            ]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.LazyLinear(classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.features(x)))


class Block(nn.Module):
    """A pre-norm transformer block with dropout and residual connections."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=0.1, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def transformer(vocab: int = 11, dim: int = 8, heads: int = 2, layers: int = 3, seed: int = 0) -> nn.Sequential:
    """Embedding (takes integer ids), blocks, final norm and a vocabulary projection."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Embedding(vocab, dim), *[Block(dim, heads) for _ in range(layers)], nn.LayerNorm(dim), nn.Linear(dim, vocab)
    )


class LoopBlock(nn.Module):
    """A residual MLP block taking a keyword side input and returning ``(x, None)``, as Hugging Face blocks do."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        return x + self.dropout(torch.tanh(self.linear(x))) * scale, None


class LoopModel(nn.Module):
    """Blocks in an ``nn.ModuleList`` called in a Python loop with a keyword argument (a buffer).

    The chain's stages are ``blocks.0`` .. ``blocks.{n-1}``.
    """

    def __init__(self, dim: int = 6, blocks: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([LoopBlock(dim) for _ in range(blocks)])
        self.head = nn.Linear(dim, 2)
        self.register_buffer("scale_tensor", torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x, _ = block(x, scale=self.scale_tensor)
        return self.head(x)


class CrossBlock(nn.Module):
    """A decoder-style block reading a context made before the chain twice (its k and v projections)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, again: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x) + self.k(context).sigmoid() * self.v(again))


class CrossModel(nn.Module):
    """An encoder's output carried into every block (``blocks.0`` .. ``blocks.{n-1}``) in two arguments: the
    same tensor twice (``same_tensor_twice``, read twice as T5's decoder blocks read theirs), or two tensors."""

    def __init__(self, same_tensor_twice: bool, dim: int = 8, blocks: int = 5, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.encode = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([CrossBlock(dim) for _ in range(blocks)])
        self.same_tensor_twice = same_tensor_twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = self.encode(x.flip(0) * 1.7)
        again = context if self.same_tensor_twice else context * 1.0
        for block in self.blocks:
            x = block(x, context, again)
        return x


def chain(length: int, names: list[list[str]] | None = None) -> Chain:
    """A chain of ``length`` stages plus the loss; sizes are placeholders (the executor ignores them)."""
    stages = [
        Stage(1.0, 2.0, 10, 12, 10, modules=tuple(names[i]) if names else ())
        for i in range(length)
    ]
    return Chain("test", 10, (*stages, Stage(0.0, 0.0, 1, 1, 1)))


def schedule(ops: list[Op], the_chain: Chain, algorithm: str = "handmade") -> Schedule:
    return Schedule(algorithm, None, tuple(ops), the_chain)


def store_all(length: int) -> list[Op]:
    """PyTorch's default: F_all(1..L+1), then B(L+1..1)."""
    return [Op(A, s) for s in range(1, length + 2)] + [Op(B, s) for s in range(length + 1, 0, -1)]


def persistent(first: int, last: int, choose) -> list[Op]:
    """A persistent sequence for stages first..last (ROTOR section 4.4), the recursion steered by ``choose``.

    ``choose(first, last)`` returns ``None`` for F_all(first) then the rest, or ``k`` (first < k <= last) for
    F_ck(first), F_none(first+1..k-1), the rest from k, then first..k-1 again.
    """
    if first == last:
        return [Op(A, first), Op(B, first)]
    k = choose(first, last)
    if k is None:
        return [Op(A, first), *persistent(first + 1, last, choose), Op(B, first)]
    forward = [Op(CK, first)] + [Op(NONE, s) for s in range(first + 1, k)]
    return forward + persistent(k, last, choose) + persistent(first, k - 1, choose)


def periodic(length: int, segment: int) -> list[Op]:
    """``checkpoint_sequential``: every segment but the last is checkpointed."""
    def choose(first: int, last: int) -> int | None:
        end = last - 1  # the loss is never inside a checkpointed segment
        if last == length + 1 and first + segment <= end:
            return first + segment
        return None
    return persistent(1, length + 1, choose)


def revolve(length: int) -> list[Op]:
    """Only a^l kept, F_all right before each B, bisection: recomputes some stages several times."""
    return persistent(1, length + 1, lambda first, last: (first + last + 1) // 2)


def random_persistent(length: int, rng: random.Random) -> list[Op]:
    def choose(first: int, last: int) -> int | None:
        return None if rng.random() < 0.4 else rng.randint(first + 1, last)
    return persistent(1, length + 1, choose)


def with_wasted_recomputations(ops: list[Op], rng: random.Random, count: int) -> list[Op]:
    """Inserts ``count`` extra F_ck operations where their input is held: still valid, not persistent.

    They go after the loss's B(L+1) only, on stages no higher than the next B's: the executor runs stages 1..L
    once each, in order, before the loss (as the model's forward calls them), and runs the operations up to
    B(l) when autograd reaches stage l, so a stage is never recomputed after its B was due.
    """
    ops = list(ops)
    length = max(op.stage for op in ops) - 1
    loss_backward = ops.index(Op(B, length + 1))
    for _ in range(count):
        position = rng.randrange(loss_backward + 1, len(ops) + 1)
        held = _held_before(ops, position)
        due = next((op.stage for op in ops[position:] if op.kind is B), 0)  # the B ending this backward segment
        candidates = [s for s in range(1, due + 1) if s - 1 in held]
        if candidates:
            ops.insert(position, Op(CK, rng.choice(candidates)))
    return ops


def _held_before(ops: list[Op], position: int) -> set[int]:
    """Indices l whose a^l (alone or in a-bar^l) is held before ``ops[position]``."""
    plain, saved = {0}, set()
    for op in ops[:position]:
        if op.kind is B:
            saved.discard(op.stage)
            plain.discard(op.stage - 1)
        elif op.kind is A:
            saved.add(op.stage)
            plain.discard(op.stage)
        else:
            if op.kind is NONE:
                plain.discard(op.stage - 1)
            plain.add(op.stage)
    return plain | saved


def measured_mlp(batch: int = 512, width: int = 32, depth: int = 8):
    """Linear+ReLU blocks with their exact chain: (model, chain, input, target for ``(out * target).sum()``).

    a = batch * width * 4 bytes for every activation; a block keeps its ReLU output (a-bar = a), its forward
    also holds the Linear output (o_f = a), its backward the weight and bias gradients (o_b); the loss
    ``(out * target).sum()`` holds the product during its forward.
    """
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    a = batch * width * 4
    stages = [Stage(1.0, 2.0, a, a, a, a, 4 * width * (width + 1), modules=(str(i),)) for i in range(depth)]
    chain = Chain("mlp", a, (*stages, Stage(0.5, 0.5, 4, 4, 4, a, 0)))
    return model, chain, torch.randn(batch, width), torch.randn(batch, width)
