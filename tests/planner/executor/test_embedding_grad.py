"""Embeddings whose backward adds into the existing ``.grad`` (planner.executor.embedding_grad).

Oracles: plain autograd's gradients on the same model and batches, bitwise for an untied embedding (each
distinct token's rows are summed in autograd's order before they are added into ``.grad``) and for a tied one
(its rows go to autograd as a sparse gradient, summed with the head's before ``.grad`` gets them, as autograd
sums the dense one), and the CPU allocator for the backward's transient.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from planner.executor.embedding_grad import install_embedding_grads, remove_embedding_grads
from tests.allocator_truth import allocator_rise_bytes
from tests.planner import real_models as R


def _grads(model: nn.Module, step: Any, micro_batches: int) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    for index in range(micro_batches):
        step(index)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_gpt2_gradients_match_plain_autograd(micro_batches: int) -> None:
    """Tied wte (its .grad exists once the head's gradient is in) and untied wpe (none on the first micro-batch:
    autograd's own backward), over one and two accumulated micro-batches."""
    real = R.gpt2(dropout=0.0)
    model: Any = real.model
    torch.manual_seed(4)
    batches = [real.make_batch(2) for _ in range(micro_batches)]

    def step(index: int) -> None:
        ids, labels = batches[index]
        model(input_ids=ids, labels=labels).loss.backward()

    reference = _grads(model, step, micro_batches)
    assert install_embedding_grads(model) == 2
    assert install_embedding_grads(model) == 0  # once
    try:
        got = _grads(model, step, micro_batches)
    finally:
        remove_embedding_grads(model)
    assert "forward" not in vars(model.transformer.wte)
    assert reference.keys() == got.keys()
    for name, want in reference.items():  # the tied wte too, where .grad existed (micro-batch 2)
        assert torch.equal(got[name], want), name


def test_padding_rows_get_no_gradient_and_other_options_run_as_written() -> None:
    torch.manual_seed(5)
    padded = nn.Embedding(30, 8, padding_idx=3)
    scaled = nn.Embedding(30, 8, scale_grad_by_freq=True)
    ids = torch.tensor([[3, 1, 3, 7], [7, 7, 2, 3]])

    def step(_: int) -> None:
        (padded(ids) * scaled(ids)).pow(2).sum().backward()

    model = nn.ModuleDict({"padded": padded, "scaled": scaled})
    reference = _grads(model, step, 2)
    install_embedding_grads(model)
    got = _grads(model, step, 2)
    for name, want in reference.items():
        assert torch.equal(got[name], want), name
    assert torch.equal(got["padded.weight"][3], torch.zeros(8))


def test_the_backward_holds_no_dense_gradient_beside_grad() -> None:
    """Allocator truth: with .grad present, a step's peak rise falls by the embedding's weight size."""
    torch.manual_seed(6)
    vocab, width = 4096, 64
    model = nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, 4))
    ids = torch.randint(0, vocab, (8, 16))

    def step() -> None:
        model(ids).sum().backward()

    step()  # .grad exists from here on
    plain = allocator_rise_bytes(step)
    install_embedding_grads(model)
    direct = allocator_rise_bytes(step)
    # the direct step's peak comes at another moment, a few activations higher than plain's before its embedding
    assert plain - direct >= 0.95 * vocab * width * 4, (plain, direct)
    assert direct < vocab * width * 4 / 10
