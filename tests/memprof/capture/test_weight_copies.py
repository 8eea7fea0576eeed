"""autocast's weight copies (bfloat16 on CPU): the casts autograd saved are ``weight_copies``, not feature maps.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` each Linear casts its weight to bfloat16; the matrix product
saves the cast for backward when its input needs a gradient (it computes the input's gradient from it). Sizes
are held against bytes computed by hand (2 bytes per weight element) and the peak against the allocator's own
events (torch.profiler's raw ``[memory]`` events, measured before memprof runs: see ``_truth_peak``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.capture import weight_copies
from memprof.capture.weight_copies import AutocastCasts, saved_weight_casts
from tests.allocator_truth import allocator_rise_bytes
from tests.memprof.helpers import CATEGORIES, forward_exit

BF16 = 2
N, D, H, C = 64, 64, 128, 512  # batch, input, hidden and output widths of the hand-sized MLP


def _profile(model: nn.Module, batch: tuple, loss_of, tmp_path, steps: int = 3,  # noqa: ANN001, ANN202
             around: bool = True, **options):  # noqa: ANN003
    """Measures the allocator's peak of one autocast step, then profiles ``steps`` of them; returns both.
    ``around=False``: the step enters no autocast region (the model's forward does); ``options``: the profiler's."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the same allocations every step

    def step() -> None:
        # Gradients kept (zeroed in place): the measured step then frees nothing made before it began, which the CPU
        # allocator could report with the size an earlier test's block at that address had.
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=around):
            loss = loss_of(model, batch)
        loss.backward()
        optimizer.step()

    step()
    # Before memprof runs: a block allocated while a profiler ran and freed in a later window would read as the
    # step's memory falling (the CPU allocator reports the frees of blocks it saw allocated while profiling).
    alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for t in (*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
                       *model.buffers(), *batch)}
    truth = sum(alive.values()) + allocator_rise_bytes(step)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, **options) as profiler:
        for _ in range(steps):
            profiler.mark_inputs(batch)  # the targets too, which only the loss reads (the allocator's start has them)
            step()
            profiler.record_stats()
    return load_trace(profiler.run_dir), truth


def _check_sums_and_truth(trace, truth: int) -> None:  # noqa: ANN001
    iterations, events = trace.iterations, trace.events
    assert (iterations[CATEGORIES].sum(axis=1) == iterations.peak_allocated_bytes).all()
    assert (events[CATEGORIES].sum(axis=1) == events.allocated_bytes).all()
    for peak in iterations.peak_allocated_bytes:
        assert abs(int(peak) - truth) <= 0.001 * truth, (int(peak), truth)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, H, bias=False), nn.ReLU(),
                         nn.Linear(H, C, bias=False))


def _cross_entropy(model: nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).float(), y)


def test_an_mlp_under_autocast_keeps_its_saved_weight_casts_apart(tmp_path) -> None:
    torch.manual_seed(1)
    trace, truth = _profile(_mlp(), (torch.randn(N, D), torch.randint(0, C, (N,))), _cross_entropy, tmp_path)
    _check_sums_and_truth(trace, truth)
    # The first Linear's input needs no gradient, so its product saves no weight: its cast lives only in autocast's
    # cache and is gone when the region ends, before backward. The two others save theirs until their backward.
    copies = BF16 * (H * H + H * C)
    # Activations in bfloat16 at the peak (the loss's backward): the first Linear's input cast (saved), both ReLU
    # outputs (saved, and the next Linear's input). The logits are gone: the loss keeps their float32 copy.
    features = BF16 * N * (D + H + H)
    iterations = trace.iterations
    assert iterations.weight_copies.tolist() == [copies] * 3  # 163,840 B
    assert iterations.feature_maps.tolist() == [features] * 3  # 40,960 B
    layers = trace.layers[trace.layers.iteration == 1].set_index("module")
    assert layers.weight_copy_bytes.to_dict() == {"": copies, "0": 0, "1": 0, "2": BF16 * H * H, "3": 0,
                                                  "4": BF16 * H * C}
    # the casts are no module's feature maps any more: the Linears keep only their outputs
    assert layers.feature_map_bytes["4"] == BF16 * N * C
    assert (trace.events.weight_copies <= copies).all()


def test_the_same_mlp_in_float32_has_no_weight_copies(tmp_path) -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        for _ in range(2):
            zoo.train_step(model, optimizer, (torch.randn(N, D), torch.randint(0, C, (N,))))
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    assert (trace.events.weight_copies == 0).all() and (trace.layers.weight_copy_bytes == 0).all()
    assert (trace.iterations.comm_buffers == 0).all()


def test_a_transformer_under_autocast(tmp_path) -> None:
    model, make_batch = zoo.transformer()
    batch = make_batch(8)
    trace, truth = _profile(model, batch, _cross_entropy, tmp_path)
    _check_sums_and_truth(trace, truth)
    # Every Linear's input needs a gradient (it comes from the embeddings), so every weight cast is saved: the
    # blocks' attention projections (in_proj_weight 3d x d, out_proj d x d) and MLP (4d x d, d x 4d), and the
    # head, whose weight is the token embedding's (tied: one cast).
    dim, vocab, layers = 64, 256, 4
    copies = BF16 * (layers * (3 * dim * dim + dim * dim + 4 * dim * dim + 4 * dim * dim) + vocab * dim)
    assert copies == 425_984
    assert trace.iterations.weight_copies.tolist() == [copies] * 3
    rows = trace.layers[trace.layers.iteration == 1].set_index("module")
    assert rows.weight_copy_bytes["h.0.attn"] == BF16 * 4 * dim * dim
    assert rows.weight_copy_bytes["h.0.mlp.0"] == rows.weight_copy_bytes["h.0.mlp.2"] == BF16 * 4 * dim * dim
    assert rows.weight_copy_bytes["head"] == BF16 * vocab * dim
    # at the end of the forward (autocast still on) the saved casts are weight copies, none a feature map
    assert forward_exit(trace, 1).weight_copies == copies


def test_gpt2_under_autocast(tmp_path) -> None:
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    from tests.planner.real_models import gpt2

    real = gpt2(dropout=0.0)
    trace, truth = _profile(real.model, real.make_batch(4), real.loss, tmp_path)
    _check_sums_and_truth(trace, truth)
    # GPT-2's Conv1D layers compute addmm(bias, x, weight): the cast weight is saved itself, not through a view
    n_embd, vocab, blocks = 64, 512, 4
    conv = blocks * (n_embd * 3 * n_embd + n_embd * n_embd + n_embd * 4 * n_embd + 4 * n_embd * n_embd)
    assert conv == sum(m.weight.numel() for m in real.model.modules() if isinstance(m, Conv1D))
    copies = BF16 * (conv + vocab * n_embd)  # and the lm_head, tied to the token embedding
    assert trace.iterations.weight_copies.tolist() == [copies] * 3
    rows = trace.layers[trace.layers.iteration == 1].set_index("module")
    assert rows.weight_copy_bytes["transformer.h.0.attn.c_attn"] == BF16 * n_embd * 3 * n_embd
    assert rows.weight_copy_bytes["lm_head"] == BF16 * vocab * n_embd


def test_the_walk_finds_the_saved_cast_and_nothing_older() -> None:
    linear = nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        earlier = linear(x)  # a graph made before the forward the walk looks at
        casts = AutocastCasts()
        casts.begin()
        out = linear(x.detach().requires_grad_())
        saved = out.grad_fn._saved_mat2  # addmm saves weight.t(): a view of the bfloat16 cast
        found = casts.end(out)
    cast = saved.data_ptr() - saved.storage_offset() * saved.element_size()
    assert saved.dtype == torch.bfloat16 and found == [(cast, 0)]  # the bias's cast is saved by nothing
    assert saved_weight_casts([earlier.grad_fn], out.grad_fn._sequence_nr() + 1) == []
    casts.begin()
    plain = linear(x)  # no autocast: nothing is walked
    assert casts.end(plain) == []


def _autocast_inside(model: nn.Module) -> nn.Module:
    """Wraps the model's forward in autocast inside its call, as accelerate does for ``mixed_precision="bf16"``
    (and a user's ``@torch.autocast`` on ``forward``): off at the model's hooks, on for its submodules."""
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # type: ignore[method-assign]
    return model


def _counted_walks(monkeypatch) -> list[int]:  # noqa: ANN001
    """Counts the graph walks the profiler's hooks make (one per root forward that ran under autocast)."""
    calls: list[int] = []
    walk = weight_copies.saved_weight_casts

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return walk(*args, **kwargs)

    monkeypatch.setattr(weight_copies, "saved_weight_casts", counted)
    return calls


def test_autocast_entered_inside_the_forward_is_seen_in_hooked_and_steady_steps(tmp_path, monkeypatch) -> None:
    walks = _counted_walks(monkeypatch)
    torch.manual_seed(1)
    batch = (torch.randn(N, D), torch.randint(0, C, (N,)))
    trace, truth = _profile(_autocast_inside(_mlp()), batch, _cross_entropy, tmp_path, steps=6, around=False,
                            detail_first=1, detail_every=0)
    _check_sums_and_truth(trace, truth)
    iterations = trace.iterations
    assert (iterations.template_iteration >= 0).any()  # steady steps among them: no submodule hook saw autocast
    # the saved casts of the two Linears whose input needs a gradient, as with autocast around the step (above)
    assert iterations.weight_copies.tolist() == [BF16 * (H * H + H * C)] * 6
    assert len(walks) == 6  # one walk per forward (the measured step ran before the profiler)


def test_a_step_without_autocast_walks_no_graph(tmp_path, monkeypatch) -> None:
    walks = _counted_walks(monkeypatch)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, detail_first=1,
                        detail_every=0) as profiler:
        for _ in range(6):
            zoo.train_step(model, optimizer, (torch.randn(N, D), torch.randint(0, C, (N,))))
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    assert (trace.iterations.template_iteration >= 0).any()  # hooked and steady steps alike
    assert walks == [] and (trace.iterations.weight_copies == 0).all()
