"""The chunked language-model head + cross-entropy against plain autograd: values, gradients, memory.

Oracles: plain autograd on the same model (Hugging Face's own ``ForCausalLMLoss``), and the CPU allocator's
events (``tests.allocator_truth``) for the memory. Tolerance (docs/planner.md, "The loss stage's options"):
the loss and every gradient within ``rtol=1e-5, atol=1e-7`` of plain autograd's in float32, because chunking
only changes the order in which float32 sums are taken (the loss over chunks, the head's weight gradient
over chunks of tokens); each term is the same.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F

from planner.executor.chunked_head import (
    DeferredLogits,
    DeferredLogitsError,
    install_chunked_head,
    remove_chunked_head,
)
from planner.executor.chunked_loss import (
    chunked_causal_lm_loss,
    chunked_linear_cross_entropy,
    shifted_targets,
)
from tests.allocator_truth import allocator_rise_bytes
from tests.planner import real_models as R

RTOL, ATOL = 1e-5, 1e-7


def _plain(hidden, weight, bias, labels, num_items=None):
    """Hugging Face's ``ForCausalLMLoss`` of ``linear(hidden)``, written out."""
    logits = F.linear(hidden, weight, bias).float().reshape(-1, weight.shape[0])
    if num_items is None:
        return F.cross_entropy(logits, shifted_targets(labels), ignore_index=-100)
    return F.cross_entropy(logits, shifted_targets(labels), ignore_index=-100, reduction="sum") / num_items


@pytest.mark.parametrize("chunk_tokens", [1, 5, 16, 1000])
@pytest.mark.parametrize("num_items", [None, 11])
@pytest.mark.parametrize("eager", [False, True])
def test_function_matches_plain_autograd(chunk_tokens, num_items, eager):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 16, 8, generator=g, requires_grad=True)
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True)
    labels = torch.randint(0, 40, (2, 16), generator=g)
    labels[0, :6] = -100  # ignored, across a chunk boundary for chunk_tokens=5
    labels[1, 9] = -100
    expected = _plain(hidden, weight, bias, labels, num_items)
    expected_grads = torch.autograd.grad(expected * 3.0, (hidden, weight, bias))  # a loss scaled after it
    got = chunked_causal_lm_loss(hidden, weight, bias, labels, chunk_tokens, num_items_in_batch=num_items,
                                 eager=eager)
    grads = torch.autograd.grad(got * 3.0, (hidden, weight, bias))
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    for found, want in zip(grads, expected_grads):
        torch.testing.assert_close(found, want, rtol=RTOL, atol=ATOL)
    # the gradient really depends on the labels: ignored rows get none
    assert grads[0][0, :5].abs().max() == 0 and grads[0][0, 5].abs().max() > 0


def test_eager_refuses_a_second_backward():
    hidden, weight = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3)
    loss = chunked_linear_cross_entropy(hidden, weight, None, torch.tensor([0, 1, 2, 3]), 2, eager=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="hands its gradients over once"):
        loss.backward()


def test_all_ignored_is_nan_like_plain_autograd():
    hidden, weight = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3)
    targets = torch.full((4,), -100)
    assert torch.isnan(F.cross_entropy(hidden @ weight.t(), targets))
    assert torch.isnan(chunked_linear_cross_entropy(hidden, weight, None, targets, 2))


def test_bad_arguments_say_how_to_fix():
    hidden, weight = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="chunk_tokens must be"):
        chunked_linear_cross_entropy(hidden, weight, None, torch.zeros(4, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="shifted_targets"):
        chunked_linear_cross_entropy(hidden, weight, None, torch.zeros(3, dtype=torch.long), 2)


def _step(model, ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


def _assert_same(reference, got):
    torch.testing.assert_close(got[0].loss, reference[0].loss, rtol=RTOL, atol=ATOL)
    assert reference[1].keys() == got[1].keys()
    for name, want in reference[1].items():
        assert torch.allclose(got[1][name], want, rtol=RTOL, atol=ATOL), (name, (got[1][name] - want).abs().max())


@pytest.mark.parametrize("build", ["gpt2", "llama"])
@pytest.mark.parametrize(("chunk_tokens", "eager"), [(7, False), (64, False), (7, True)])
def test_hugging_face_models_match_plain_autograd(build, chunk_tokens, eager):
    real = R.gpt2(dropout=0.0) if build == "gpt2" else R.llama()
    model: Any = real.model
    torch.manual_seed(1)
    ids, labels = real.make_batch(2)
    labels[0, :9] = -100
    labels[1, -3:] = -100
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(40)}):
        reference = _step(model, ids, labels, **kwargs)
        assert not isinstance(reference[0].logits, DeferredLogits)
        install_chunked_head(model, chunk_tokens, eager=eager)
        try:
            got = _step(model, ids, labels, **kwargs)
        finally:
            remove_chunked_head(model)
        assert isinstance(got[0].logits, DeferredLogits)  # the chunked path really ran
        _assert_same(reference, got)
    if build == "gpt2":  # tied: one Parameter, whose gradient sums the embedding's and the head's
        assert model.lm_head.weight is model.transformer.wte.weight
        assert len(got[1]) == len(list(model.parameters()))


def test_deferred_logits_refuse_use_and_other_forwards_run_as_written():
    real = R.gpt2(dropout=0.0)
    model = real.model
    torch.manual_seed(2)
    ids, labels = real.make_batch(2)
    with torch.no_grad():
        plain_logits = model(input_ids=ids).logits
    install_chunked_head(model, 8)
    out = model(input_ids=ids, labels=labels)
    with pytest.raises(DeferredLogitsError, match="remove the chunked loss"):
        out.logits.argmax(-1)
    assert "DeferredLogits" in repr(out.logits)
    assert torch.equal(model(input_ids=ids).logits.detach(), plain_logits)  # no labels: the head runs
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, labels=labels).logits, plain_logits)
    model.eval()
    assert torch.equal(model(input_ids=ids, labels=labels).logits.detach(), plain_logits)
    model.train()
    remove_chunked_head(model)
    assert "forward" not in model.lm_head.__dict__ and "_loss_function" not in model.__dict__
    assert not isinstance(model(input_ids=ids, labels=labels).logits, DeferredLogits)


def test_refuses_a_model_without_a_linear_head():
    with pytest.raises(ValueError, match="chunked_linear_cross_entropy"):
        install_chunked_head(torch.nn.Sequential(torch.nn.Linear(2, 2)), 4)


def test_refuses_what_would_silently_change_the_loss():
    """A model that alters its logits after the head, or whose loss is not ForCausalLMLoss: a clear refusal."""
    real = R.gpt2(dropout=0.0)
    model: Any = real.model
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        install_chunked_head(model, 4)
    model.config.final_logit_softcapping = None
    model.loss_function = lambda logits, labels, vocab_size, **kwargs: logits.sum()
    with pytest.raises(ValueError, match="ForCausalLMLoss"):
        install_chunked_head(model, 4)
    with pytest.raises(ValueError, match="exactly one"):
        install_chunked_head(R.gpt2(dropout=0.0).model, 4, chunks=2)


def test_a_number_of_chunks_follows_the_batch():
    real = R.gpt2(dropout=0.0)
    head = install_chunked_head(real.model, chunks=3)
    assert [head.tokens_per_chunk(n) for n in (64, 65, 2)] == [22, 22, 1]


@pytest.mark.parametrize("eager", [False, True])
def test_peak_drops_by_about_the_logits_size(eager):
    """Allocator truth: the step's peak with chunks is below plain autograd's by at least the logits' size."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    vocab, batch, seq = 8192, 2, 128
    settings: dict[str, Any] = dict(vocab_size=vocab, n_positions=seq, n_embd=32, n_layer=1, n_head=2, use_cache=False,
                                    attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                    bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    config = GPT2Config(**settings)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    model.train()
    ids = torch.randint(0, vocab, (batch, seq))
    logits_bytes = batch * seq * vocab * 4

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()

    _step(model, ids, ids)  # gradients exist: the steps measured below allocate none of them
    plain = allocator_rise_bytes(step)
    install_chunked_head(model, 32, eager=eager)
    try:
        chunked = allocator_rise_bytes(step)
    finally:
        remove_chunked_head(model)
    assert plain - chunked >= logits_bytes, (plain, chunked, logits_bytes)
    assert chunked < plain / 2  # the logits dominate this step; chunks of 32 tokens are 1/8 of them


@pytest.mark.parametrize(("eager", "extra"), [(False, 1), (True, 0)])
def test_flops_are_plain_autograds_plus_one_head_forward_when_recomputing(eager, extra):
    """FlopCounterMode (what benchmark 10 counts with) sees every matmul: plain 3 x 2NVH (forward, the two
    backward products); recomputing adds the head's forward once, eager adds nothing."""
    from torch.utils.flop_counter import FlopCounterMode

    tokens, features, vocabulary = 24, 8, 50
    hidden = torch.randn(tokens, features, requires_grad=True)
    weight = torch.randn(vocabulary, features, requires_grad=True)
    targets = torch.randint(0, vocabulary, (tokens,))
    with FlopCounterMode(display=False) as plain:
        F.cross_entropy(hidden @ weight.t(), targets).backward()
    with FlopCounterMode(display=False) as chunked:
        chunked_linear_cross_entropy(hidden, weight, None, targets, 5, eager=eager).backward()
    head = 2 * tokens * features * vocabulary
    assert plain.get_total_flops() == 3 * head
    assert chunked.get_total_flops() == (3 + extra) * head
