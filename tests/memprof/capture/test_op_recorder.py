"""The op recorder against what autograd really saves: by hand on small layers, on GPT-2, and its clean-up."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from memprof.analysis.op_records import OpRecord
from memprof.capture.op_recorder import OpRecorder
from memprof.errors import ProfilerError

F32 = 4


class SavedByAutograd:
    """Outer saved-tensor hooks (the recorder chains to them): the storages autograd saved, by address."""

    def __init__(self) -> None:
        self.saved: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr():
            self.saved[storage.data_ptr()] = storage.nbytes()
        return tensor


def record(model: nn.Module, *inputs: torch.Tensor) -> tuple[list[OpRecord], Any, SavedByAutograd]:
    truth = SavedByAutograd()
    with truth.hooks, OpRecorder(model) as recorder:
        out = model(*inputs)
    return recorder.records, out, truth


def named(records: list[OpRecord], op: str) -> list[OpRecord]:
    return [r for r in records if r.op == op]


def outside_bytes(model: nn.Module, inputs: tuple[torch.Tensor, ...], saved: dict[int, int]) -> int:
    """Bytes of the saved storages that were made before the forward (parameters, buffers, inputs)."""
    before = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), *inputs)}
    return sum(nbytes for ptr, nbytes in saved.items() if ptr in before)


def needed_bytes(records: list[OpRecord]) -> int:
    needed = {i for r in records for i in r.needs}
    return sum(records[i].output_bytes for i in needed)


def test_mlp_addmm_outputs_and_needs_are_what_autograd_saves() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh())
    x = torch.randn(5, 8)
    records, out, truth = record(model, x)
    assert [r.op for r in records] == ["aten.t.default", "aten.addmm.default", "aten.relu.default",
                                       "aten.t.default", "aten.addmm.default", "aten.tanh.default"]
    assert [r.module for r in records] == ["0", "0", "1", "2", "2", "3"]
    assert [r.index for r in records] == list(range(6))
    assert [r.output_bytes for r in records] == [0, 5 * 16 * F32, 5 * 16 * F32, 0, 5 * 4 * F32, 5 * 4 * F32]
    # first addmm saves x (an input, not listed); relu and tanh their outputs; the second addmm relu's output
    assert [r.needs for r in records] == [(), (), (2,), (), (2,), (5,)]
    assert [r.flops for r in records] == [0, 2 * 5 * 8 * 16, 0, 0, 2 * 5 * 16 * 4, 0]
    assert all(r.forward_ms > 0 for r in records)
    # what the needs name is exactly what autograd saved beyond parameters and the input
    assert needed_bytes(records) == sum(truth.saved.values()) - outside_bytes(model, (x,), truth.saved)
    assert needed_bytes(records) == (5 * 16 + 5 * 4) * F32


def test_reads_name_the_ops_whose_outputs_each_op_takes_by_storage() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh())
    records, _, _ = record(model, torch.randn(5, 8))
    # t reads a weight, the first addmm the input, a bias and t's view of a weight: all made outside the forward;
    # the second t is a view of a parameter too, so the second addmm reads relu's output alone
    assert [r.reads for r in records] == [(), (), (1,), (), (2,), (4,)]


def test_reads_follow_views_and_in_place_writes_to_the_op_that_allocated() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), _Wrap(lambda h: h.view(2, 2, 4).transpose(1, 2).tanh()))
    records, _, _ = record(model, torch.randn(2, 4))
    linear = named(records, "aten.addmm.default")[0]
    mask = next(r for r in records if r.op.startswith("aten.empty"))
    fill = next(r for r in records if r.op.startswith("aten.bernoulli_"))
    scale = next(r for r in records if r.op.startswith("aten.div_"))
    dropout = named(records, "aten.mul.Tensor")[0]
    assert mask.reads == (linear.index,)  # empty_like(input) takes the input, for its shape
    assert fill.reads == fill.writes == (mask.index,) and scale.reads == scale.writes == (mask.index,)
    assert dropout.reads == (linear.index, mask.index)
    views = [r for r in records if r.module == "2" and r.op != "aten.tanh.default"]
    assert views and all(r.reads == (dropout.index,) for r in views)  # a view reads its base's allocator
    assert named(records, "aten.tanh.default")[0].reads == (dropout.index,)
    assert all(all(i < r.index for i in r.reads or ()) for r in records)


class _Wrap(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def test_layer_norm_saves_its_input_and_its_own_mean_and_rstd() -> None:
    model = nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10))
    x = torch.randn(3, 6)
    records, _, truth = record(model, x)
    linear, norm = named(records, "aten.addmm.default")[0], named(records, "aten.native_layer_norm.default")[0]
    assert norm.needs == (linear.index, norm.index)
    assert norm.output_bytes == (3 * 10 + 3 + 3) * F32  # output, mean and rstd
    # autograd saved the linear's output, mean and rstd; the norm's output (the model's) nothing saves, but a
    # need names an op, all of whose outputs it counts: the one over-count of the record's granularity
    saved = sum(truth.saved.values()) - outside_bytes(model, (x,), truth.saved)
    assert saved == linear.output_bytes + (3 + 3) * F32
    assert needed_bytes(records) == saved + 3 * 10 * F32


@pytest.mark.parametrize(("fn", "op", "saves_self"), [
    (torch.relu, "aten.relu.default", True),
    (torch.tanh, "aten.tanh.default", True),
    (torch.sigmoid, "aten.sigmoid.default", True),
    (F.gelu, "aten.gelu.default", False),
    (F.silu, "aten.silu.default", False),
])
def test_activations_need_their_output_or_their_input(fn: Callable[..., torch.Tensor], op: str,
                                                      saves_self: bool) -> None:
    model = nn.Sequential(nn.Linear(4, 8), _Wrap(fn))
    records, _, _ = record(model, torch.randn(2, 4))
    linear, act = named(records, "aten.addmm.default")[0], named(records, op)[0]
    assert act.needs == ((act.index,) if saves_self else (linear.index,))
    assert act.output_bytes == 2 * 8 * F32


def test_dropout_needs_its_mask() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5))
    x = torch.randn(2, 4)
    records, out, truth = record(model, x)
    dropout = [r for r in records if r.module == "1"]
    assert dropout and dropout[-1].output_bytes == 2 * 8 * F32
    mask_makers = {i for i in dropout[-1].needs}
    assert len(mask_makers) == 1 and records[mask_makers.pop()].module == "1"  # the mask, made by dropout
    filled = [r for r in dropout if r.op.startswith("aten.bernoulli_")]
    assert filled and records[filled[0].writes[0]].op.startswith("aten.empty")  # the mask's storage, filled
    assert needed_bytes(records) == sum(truth.saved.values()) - outside_bytes(model, (x,), truth.saved)


def test_scaled_dot_product_attention_needs_its_own_outputs_and_counts_flops() -> None:
    q, k, v = (torch.randn(2, 2, 8, 4, requires_grad=True) for _ in range(3))
    model = _Wrap(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    records, _, truth = record(model, q, k, v)
    assert len(records) == 1
    attention = records[0]
    assert attention.needs == (0,)  # output and logsumexp; q, k, v are inputs
    assert attention.flops == 4 * 2 * 2 * 8 * 8 * 4  # two batched matmuls of 2*2 heads, 8x8 scores, dim 4
    assert attention.output_bytes == needed_bytes(records)
    assert needed_bytes(records) == sum(truth.saved.values()) - outside_bytes(model, (q, k, v), truth.saved)


def test_conv_batchnorm_and_inplace_relu() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Conv2d(4, 2, 1))
    x = torch.randn(2, 3, 8, 8)
    records, _, truth = record(model, x)
    conv1, conv2 = named(records, "aten.convolution.default")
    norm = named(records, "aten.native_batch_norm.default")[0]
    relu = named(records, "aten.relu_.default")[0]
    assert conv1.output_bytes == 2 * 4 * 6 * 6 * F32 and conv1.needs == ()  # it saves x, an input
    assert norm.needs == (conv1.index, norm.index)  # its input, and its saved mean and invstd
    assert norm.output_bytes == (2 * 4 * 6 * 6 + 4 + 4) * F32
    assert relu.output_bytes == 0  # in place: batch norm's output storage, which relu_ saves
    assert relu.needs == (norm.index,)
    assert relu.writes == (norm.index,) and conv1.writes == () and norm.writes == ()
    counter = [r for r in named(records, "aten.add_.Tensor") if r.module == "1"]
    assert counter and all(r.writes == () for r in counter)  # num_batches_tracked, made outside the forward
    assert conv2.needs == (norm.index,)
    assert conv1.flops == 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3)
    assert needed_bytes(records) == sum(truth.saved.values()) - outside_bytes(model, (x,), truth.saved)


def test_views_allocate_nothing_and_needs_name_the_storage_maker() -> None:
    model = nn.Sequential(nn.Linear(4, 12), _Wrap(lambda h: h.view(2, 3, 4).transpose(1, 2)), _Wrap(torch.tanh))
    records, _, _ = record(model, torch.randn(2, 4))
    linear = named(records, "aten.addmm.default")[0]
    assert all(r.output_bytes == 0 for r in records if r.module == "1")
    tanh = named(records, "aten.tanh.default")[0]
    assert tanh.needs == (tanh.index,)
    assert linear.output_bytes == 2 * 12 * F32


@pytest.fixture(scope="module")
def gpt2() -> tuple[nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    return model, torch.randint(0, 100, (2, 16))


def test_gpt2_every_block_has_counted_matmuls_and_saved_outputs(gpt2: tuple[nn.Module, torch.Tensor]) -> None:
    model, ids = gpt2
    truth = SavedByAutograd()
    with truth.hooks, OpRecorder(model) as recorder:
        loss = model(ids, labels=ids).loss
    records = recorder.records
    needed = {i for r in records for i in r.needs}
    for block in ("transformer.h.0", "transformer.h.1"):
        inside = [r for r in records if r.module == block or r.module.startswith(block + ".")]
        matmuls = [r for r in inside if r.op.split(".")[1] in {"addmm", "mm", "bmm", "baddbmm"}]
        assert len(matmuls) >= 4 and all(r.flops > 0 for r in matmuls)  # c_attn, attention, c_proj, c_fc ...
        assert sum(records[i].output_bytes for i in needed if records[i] in inside) > 0
        c_fc = [r for r in inside if r.module == f"{block}.mlp.c_fc" and r.op == "aten.addmm.default"]
        assert len(c_fc) == 1 and c_fc[0].flops == 2 * (2 * 16) * 64 * 256
        assert c_fc[0].output_bytes == 2 * 16 * 256 * F32
    # every output of a needed op is saved but the loss itself (nll_loss saves only its total_weight)
    saved = sum(truth.saved.values()) - outside_bytes(model, (ids,), truth.saved)
    assert needed_bytes(records) == saved + loss.untyped_storage().nbytes()
    assert records[-1].op == "aten.nll_loss_forward.default" and records[-1].index in needed
    assert recorder.unattributed == 0
    loss.backward()  # the graph recorded under the hooks still runs


def test_gradients_are_unchanged_and_no_tensor_is_kept() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 1))
    x = torch.randn(4, 8)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch.autograd.graph.save_on_cpu(), OpRecorder(model) as recorder:  # chained to save_on_cpu's hooks
        out = model(x)
    assert len(recorder.records) > 0
    out.sum().backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))
    watched = weakref.ref(out)
    del out
    gc.collect()
    assert watched() is None


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_recorder_leaves_nothing_behind_even_when_the_forward_raises() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Wrap(lambda h: h @ torch.ones(3, 3)))
    before = _hooks(model)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError), OpRecorder(model) as recorder:
        model(x)
    assert _hooks(model) == before
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert _get_current_dispatch_mode() is None
    assert [r.op for r in recorder.records][:2] == ["aten.t.default", "aten.addmm.default"]
    with pytest.raises(ProfilerError, match="already recorded"):
        recorder.start()
