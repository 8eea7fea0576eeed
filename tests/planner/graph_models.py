"""Models whose blocks do not form a chain, written the way their authors write them, for the graph tests.

* ``unet``: a U-Net in the shape of the widely copied PyTorch U-Net (``inc``, ``down1..3``, ``up1..3``,
  ``outc``; each ``Down`` an ``nn.Sequential`` of a max-pool and a double convolution; each ``Up`` takes the
  running tensor and the encoder's output at its level, upsamples the first and concatenates them).
* ``seq2seq``: an encoder-decoder transformer on ``torch.nn.Transformer`` (every decoder layer reads the
  encoder's output, ``memory``; the target embedding enters the first decoder layer beside it).
* ``branches``: a stem, then blocks with two parallel branches merged by a concatenation, then a head.

Each builder seeds torch and returns a :class:`tests.planner.real_models.RealModel`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.planner.real_models import RealModel


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        x1 = self.up(x1)
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, channels: int = 3, classes: int = 2, width: int = 8) -> None:
        super().__init__()
        w = width
        self.inc = DoubleConv(channels, w)
        self.down1, self.down2, self.down3 = Down(w, 2 * w), Down(2 * w, 4 * w), Down(4 * w, 8 * w)
        self.up1, self.up2, self.up3 = Up(8 * w, 4 * w), Up(4 * w, 2 * w), Up(2 * w, w)
        self.outc = nn.Conv2d(w, classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x = self.up1(x4, x3)
        x = self.up2(x, x2)
        x = self.up3(x, x1)
        return self.outc(x)


def unet(seed: int = 0) -> RealModel:
    torch.manual_seed(seed)
    model = UNet()
    model.train()

    def make_batch(n: int) -> tuple:
        return torch.randn(n, 3, 32, 32), torch.randint(0, 2, (n, 32, 32))

    def loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        images, masks = batch
        return F.cross_entropy(model(images), masks)

    blocks = ("inc", "down1", "down2", "down3", "up1", "up2", "up3", "outc")
    return RealModel("unet", model, make_batch, loss, blocks)


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int = 64, d_model: int = 32, layers: int = 3, seq: int = 16) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(d_model, nhead=4, num_encoder_layers=layers, num_decoder_layers=layers,
                                          dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        out = self.transformer(self.src_embed(src), self.tgt_embed(tgt), tgt_mask=self.causal, tgt_is_causal=True)
        return self.head(out)


def seq2seq(seed: int = 0) -> RealModel:
    torch.manual_seed(seed)
    model = Seq2Seq()
    model.train()

    def make_batch(n: int) -> tuple:
        return torch.randint(0, 64, (n, 16)), torch.randint(0, 64, (n, 16)), torch.randint(0, 64, (n, 16))

    def loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        src, tgt, labels = batch
        return F.cross_entropy(model(src, tgt).flatten(0, 1), labels.flatten())

    encoder = tuple(f"transformer.encoder.layers.{i}" for i in range(3))
    decoder = tuple(f"transformer.decoder.layers.{i}" for i in range(3))
    return RealModel("seq2seq", model, make_batch, loss, (*encoder, *decoder))


class TwoBranch(nn.Module):
    """Two parallel branches of different depth on one input, concatenated and mixed."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.right = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))
        self.merge = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge(torch.cat([self.left(x), self.right(x)], dim=-1))


class Branches(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Linear(32, width)
        self.blocks = nn.ModuleList(TwoBranch(width) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def branches(seed: int = 0) -> RealModel:
    torch.manual_seed(seed)
    model = Branches()
    model.train()

    def make_batch(n: int) -> tuple:
        return torch.randn(64 * n, 32), torch.randint(0, 10, (64 * n,))

    def loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs), labels)

    return RealModel("branches", model, make_batch, loss, tuple(f"blocks.{i}" for i in range(4)))


GRAPH_BUILDERS = {"unet": unet, "seq2seq": seq2seq, "branches": branches}
