"""Small models written "by others", built the way users train them, for the planner's tests.

Hugging Face ``transformers`` models come from configs with random weights (nothing is downloaded);
the CNNs and the ViT copy the shape of torchvision's code (its module names, its ``forward``) without
importing torchvision. Each builder seeds torch, stays under 3M parameters and runs one CPU training
step in well under 100 ms at the batch sizes the tests use (2 to 8).

``RealModel.blocks`` names the modules a block-level chain planner should find, in order. A block is
either a leaf-ish module the top-level forward calls directly (``conv1``) or one element of a repeated
container (``layer1.0``, ``transformer.h.2``); for the transformers only the repeated blocks are listed
(the embeddings before them and the final norm and head after them are the prologue and the loss).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class RealModel:
    name: str
    model: nn.Module
    make_batch: Callable[[int], tuple]  # batch size -> batch; draws from torch's global RNG
    loss: Callable[[nn.Module, tuple], torch.Tensor]  # runs the model on a batch, returns a scalar
    blocks: tuple[str, ...]  # qualified names of the expected block-level chain, in order


# --- Hugging Face transformers ------------------------------------------------------------------------
#
# attn_implementation="eager" everywhere: the attention is then plain matmul/softmax/dropout ops whose
# saved tensors (the attention probabilities) are ordinary tensors the profiler sees, the result is the
# same on every torch build, and the mask is always materialised as a 4-D float tensor passed to every
# layer. With "sdpa" (the default), the kernel is chosen by device, dtype and mask (flash / memory-
# efficient / math), so the memory a layer saves changes from machine to machine, and the causal mask is
# sometimes dropped (None) in favour of is_causal=True -- not what a planner test should depend on.

_VOCAB, _SEQ = 512, 32


def _lm_batch(vocab: int = _VOCAB, seq: int = _SEQ) -> Callable[[int], tuple]:
    def make_batch(n: int) -> tuple:
        ids = torch.randint(0, vocab, (n, seq))
        return ids, ids.clone()  # causal LM: labels are the inputs, shifted inside the model
    return make_batch


def _lm_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    input_ids, labels = batch
    return model(input_ids=input_ids, labels=labels).loss


def gpt2(seed: int = 0, dropout: float = 0.1) -> RealModel:
    """GPT2LMHeadModel, 4 blocks, dropout everywhere (so recomputing a block must replay the RNG; ``dropout=0``
    for none)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=_VOCAB, n_positions=64, n_embd=64, n_layer=4, n_head=4,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False, attn_implementation="eager",
        bos_token_id=_VOCAB - 1, eos_token_id=_VOCAB - 1,  # inside the small vocabulary (else a warning)
    )
    model = GPT2LMHeadModel(config)  # lm_head is tied to transformer.wte
    model.loss_type = "ForCausalLM"  # what it falls back to anyway, without the warning the fallback logs
    model.train()
    return RealModel("gpt2", model, _lm_batch(), _lm_loss, tuple(f"transformer.h.{i}" for i in range(4)))


def bert(seed: int = 0) -> RealModel:
    """BertForMaskedLM, 8 layers, a 128-token vocabulary (so the encoder's activations, not the prediction
    head's, dominate the step, as in a real BERT); the batch has right padding and 15% masked labels."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    vocab, layers = 128, 8
    config = BertConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        pad_token_id=0, attn_implementation="eager",
    )
    model = BertForMaskedLM(config)
    model.train()
    mask_token = 1

    def make_batch(n: int) -> tuple:
        input_ids = torch.randint(2, vocab, (n, _SEQ))
        lengths = torch.randint(_SEQ // 2, _SEQ + 1, (n,))
        lengths[0] = _SEQ  # one full row, the others usually padded
        attention_mask = (torch.arange(_SEQ)[None, :] < lengths[:, None]).long()
        input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id)
        chosen = (torch.rand(n, _SEQ) < 0.15) & attention_mask.bool()
        chosen[:, 0] = True  # at least one label per row, so the loss is never NaN
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
        input_ids = input_ids.masked_fill(chosen, mask_token)
        return input_ids, attention_mask, labels

    def loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        input_ids, attention_mask, labels = batch
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss

    return RealModel("bert", model, make_batch, loss, tuple(f"bert.encoder.layer.{i}" for i in range(layers)))


def llama(seed: int = 0) -> RealModel:
    """LlamaForCausalLM, 4 layers, grouped-query attention (4 query heads, 2 key/value heads), rotary
    embeddings computed once by ``model.rotary_emb`` and passed to every layer; no dropout (as Llama)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=_VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    model.train()
    return RealModel("llama", model, _lm_batch(), _lm_loss, tuple(f"model.layers.{i}" for i in range(4)))


def t5(seed: int = 0) -> RealModel:
    """T5ForConditionalGeneration, 3 encoder and 3 decoder blocks, dropout; the first block of each stack
    computes the relative position bias and returns it, and the later blocks read it (a trainable secondary
    output). The encoder's input is twice the decoder's, so its blocks are the chain to plan."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=_VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_decoder_layers=3, num_heads=4,
        dropout_rate=0.1, use_cache=False, decoder_start_token_id=0, pad_token_id=0, attn_implementation="eager",
    )
    model = T5ForConditionalGeneration(config)
    model.train()

    def make_batch(n: int) -> tuple:
        return torch.randint(1, _VOCAB, (n, 2 * _SEQ)), torch.randint(1, _VOCAB, (n, _SEQ))

    def loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        input_ids, labels = batch
        return model(input_ids=input_ids, labels=labels).loss

    return RealModel("t5", model, make_batch, loss, tuple(f"encoder.block.{i}" for i in range(3)))


# --- torchvision-style CNNs and ViT (torchvision's code shape and module names, written here) ------------

def _image_batch(classes: int, size: int = 32) -> Callable[[int], tuple]:
    def make_batch(n: int) -> tuple:
        return torch.randn(n, 3, size, size), torch.randint(0, classes, (n,))
    return make_batch


def _cross_entropy(model: nn.Module, batch: tuple) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: one in-place ``relu`` module called twice per forward."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    """torchvision's ResNet (resnet18 layout: 2 BasicBlocks per stage) with narrow widths."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * BasicBlock.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * BasicBlock.expansion, stride),
                nn.BatchNorm2d(planes * BasicBlock.expansion),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        for _ in range(1, blocks):
            layers.append(BasicBlock(self.inplanes, planes))
        return nn.Sequential(*layers)

    def _forward_impl(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)

        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward_impl(x)


def resnet(seed: int = 0) -> RealModel:
    """A narrow resnet18 on 32x32 images (spatial 16 -> 8 after maxpool -> 8, 4, 2, 1 in layer1..4).

    Expected chain, flattened across nesting: the stem modules, every BasicBlock, then avgpool and fc
    (fc's input is ``torch.flatten`` of avgpool's output: a view, same storage). ``relu`` is listed though
    it is in place: its output IS bn1's output storage, so a storage-linked chain finder folds it into
    bn1's stage (stage ``bn1..relu``) rather than making it a stage of its own.
    """
    torch.manual_seed(seed)
    model = ResNet()
    blocks = ("conv1", "bn1", "relu", "maxpool",
              *(f"layer{i}.{j}" for i in range(1, 5) for j in range(2)), "avgpool", "fc")
    return RealModel("resnet", model, _image_batch(10), _cross_entropy, blocks)


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU(nn.Sequential):
    """torchvision's (older) ConvBNReLU: Conv2d, BatchNorm2d, in-place ReLU6."""

    def __init__(self, in_planes: int, out_planes: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = self.stride == 1 and inp == oup

        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden_dim, kernel_size=1))  # pw
        layers.extend([
            ConvBNReLU(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),  # dw
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),  # pw-linear
            nn.BatchNorm2d(oup),
        ])
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 layout with width_mult 0.5 and a shortened inverted-residual setting."""

    def __init__(self, num_classes: int = 10, width_mult: float = 0.5, last_channel: int = 256) -> None:
        super().__init__()
        input_channel = _make_divisible(32 * width_mult)
        self.last_channel = last_channel
        inverted_residual_setting = [
            # t, c, n, s
            [1, 16, 1, 1],
            [6, 24, 2, 2],
            [6, 32, 2, 2],
            [6, 64, 2, 2],
            [6, 96, 1, 1],
        ]
        features: list[nn.Module] = [ConvBNReLU(3, input_channel, stride=2)]
        for t, c, n, s in inverted_residual_setting:
            output_channel = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(InvertedResidual(input_channel, output_channel, stride, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(self.last_channel, num_classes))

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


def mobilenet(seed: int = 0) -> RealModel:
    """A narrow MobileNetV2 on 32x32 images: ``features`` = stem ConvBNReLU, 8 InvertedResiduals (features.3,
    .5 and .7 have the residual add; the others change stride or channels), a 1x1 ConvBNReLU.

    Expected chain: ``features.0..features.9``. The classifier is not listed: its input comes from the
    functional ``adaptive_avg_pool2d`` (a new storage no module produced), so it is not storage-linked to
    ``features.9``.
    """
    torch.manual_seed(seed)
    model = MobileNetV2()
    blocks = tuple(f"features.{i}" for i in range(len(model.features)))
    return RealModel("mobilenet", model, _image_batch(10), _cross_entropy, blocks)


class MLPBlock(nn.Sequential):
    """torchvision's ViT MLP: Linear, GELU, Dropout, Linear, Dropout (children named "0".."4")."""

    def __init__(self, in_dim: int, mlp_dim: int, dropout: float) -> None:
        super().__init__(nn.Linear(in_dim, mlp_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_dim, in_dim),
                         nn.Dropout(dropout))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)


class EncoderBlock(nn.Module):
    """Pre-norm: x + dropout(attention(ln_1(x))), then + mlp(ln_2(.))."""

    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int, dropout: float, attention_dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=attention_dropout,
                                                    batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x)
        x = x + input

        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class Encoder(nn.Module):
    def __init__(self, seq_length: int, num_layers: int, num_heads: int, hidden_dim: int, mlp_dim: int,
                 dropout: float, attention_dropout: float) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(num_layers):
            layers[f"encoder_layer_{i}"] = EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout, attention_dropout)
        self.layers = nn.Sequential(layers)
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class VisionTransformer(nn.Module):
    """torchvision's VisionTransformer: patchify conv, class token, Encoder, ``heads`` (a Sequential holding
    the ``head`` Linear, as torchvision builds it)."""

    def __init__(self, image_size: int = 32, patch_size: int = 4, num_layers: int = 4, num_heads: int = 4,
                 hidden_dim: int = 64, mlp_dim: int = 128, dropout: float = 0.1, attention_dropout: float = 0.1,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        seq_length += 1
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout)
        self.seq_length = seq_length
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden_dim, num_classes)))

        fan_in = self.conv_proj.in_channels * self.conv_proj.kernel_size[0] * self.conv_proj.kernel_size[1]
        nn.init.trunc_normal_(self.conv_proj.weight, std=(1 / fan_in) ** 0.5)
        nn.init.zeros_(self.conv_proj.bias)

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        p = self.patch_size
        n_h = h // p
        n_w = w // p
        x = self.conv_proj(x)  # (n, c, h, w) -> (n, hidden_dim, n_h, n_w)
        x = x.reshape(n, self.hidden_dim, n_h * n_w)
        x = x.permute(0, 2, 1)  # (n, seq, hidden_dim): the encoder expects batch first
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)
        x = self.encoder(x)
        x = x[:, 0]  # the class token
        x = self.heads(x)
        return x


def vit(seed: int = 0) -> RealModel:
    """A ViT on 32x32 images, 4x4 patches (65 tokens with the class token), 4 encoder blocks with dropout.

    Expected chain: the encoder blocks ``encoder.layers.encoder_layer_0..3``. Before them the permuted
    patch embedding is concatenated with the class token and added to the positions (new storages), so
    ``conv_proj`` is not linked to them by storage; after them come ``encoder.ln`` and ``heads`` (on a
    view of ln's output), the head of the loss.
    """
    torch.manual_seed(seed)
    model = VisionTransformer()
    blocks = tuple(f"encoder.layers.encoder_layer_{i}" for i in range(4))
    return RealModel("vit", model, _image_batch(10), _cross_entropy, blocks)


ALL_BUILDERS: dict[str, Callable[[], RealModel]] = {
    "gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "resnet": resnet, "mobilenet": mobilenet, "vit": vit,
}
