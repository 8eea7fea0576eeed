"""The loss stage's chunked options from the head's costs: which module is the head, and hand-computed bytes."""

from __future__ import annotations

import pytest

from planner.discovery.loss_options import (
    LossHead,
    chunk_options,
    find_head,
    logits_factor,
    with_loss_options,
    without_weight_grads,
)
from planner.errors import ChainError
from planner.model.chain import Chain, Stage

MIB = 2**20


def test_the_head_is_the_last_linear_after_the_chain() -> None:
    modules = [("", 0, "GPT2LMHeadModel"), ("transformer", 1, "GPT2Model"), ("transformer.h.0", 2, "GPT2Block"),
               ("transformer.h.0.mlp.c_fc", 3, "Linear"), ("transformer.h.1", 4, "GPT2Block"),
               ("transformer.ln_f", 5, "LayerNorm"), ("lm_head", 6, "Linear")]
    assert find_head(modules, ["transformer.h.0", "transformer.h.1"]) == "lm_head"
    assert find_head(modules, ["transformer.h.0", "transformer.h.1", "lm_head"]) is None  # the head is a stage
    assert find_head(modules[:-1], ["transformer.h.0"]) is None  # the Linear inside a stage is not a head
    assert find_head(modules, []) is None


def _loss(saved: int) -> Stage:
    return Stage(forward_ms=4.0, backward_ms=8.0, output_bytes=0, saved_bytes=saved, grad_bytes=0,
                 forward_overhead_bytes=1000, backward_overhead_bytes=5 * MIB, name="loss", weight_grad_bytes=2 * MIB)


def test_hand_computed_options() -> None:
    head = LossHead("lm_head", logits_bytes=8 * MIB, forward_ms=3.0, flops=10**9, weight_bytes=2 * MIB)
    loss = _loss(16 * MIB + 4096)  # float32 logits and their log-softmax, and the targets
    assert logits_factor(loss, head.logits_bytes) == 2
    assert logits_factor(_loss(24 * MIB), head.logits_bytes) == 3  # half-precision logits: their fp32 log-softmax
    options = {o.name: o for o in chunk_options(loss, head, (4, 16), chunk_overhead_ms=0.5, results_bytes=3 * MIB)}
    assert list(options) == ["chunks=4", "chunks=4 eager", "chunks=16", "chunks=16 eager"]
    four = options["chunks=4"]
    assert (four.saved_bytes, four.forward_overhead_bytes, four.backward_overhead_bytes) == (4096, 1000 + 4 * MIB,
                                                                                             1000 + 4 * MIB)
    assert (four.recompute_ms, four.recompute_flops, four.chunks, four.eager) == (3.0 + 2.0, 10**9, 4, False)
    eager = options["chunks=16 eager"]
    assert (eager.saved_bytes, eager.forward_overhead_bytes, eager.backward_overhead_bytes) == (4096 + 3 * MIB,
                                                                                                1000 + MIB, 0)
    assert (eager.recompute_ms, eager.recompute_flops, eager.eager) == (8.0, 0, True)
    with pytest.raises(ChainError, match=">= 2"):
        chunk_options(loss, head, (1,))
    assert chunk_options(_loss(0), head) == ()  # nothing to drop


def test_a_chain_gets_them_on_its_loss_and_keeps_them_without_weight_grads() -> None:
    block = Stage(forward_ms=1.0, backward_ms=2.0, output_bytes=MIB, saved_bytes=3 * MIB, grad_bytes=MIB,
                  name="b", modules=("h.0",), weight_grad_bytes=MIB)
    chain = Chain("c", MIB, (block, _loss(16 * MIB)))
    head = LossHead("lm_head", logits_bytes=8 * MIB, forward_ms=3.0, weight_bytes=2 * MIB)
    chunked = with_loss_options(chain, head, (8,))
    eager = chunked.stages[-1].options[1]
    assert eager.saved_bytes == MIB + 2 * MIB  # delta^L and the head's gradient, nothing of the logits
    # float32 logits (16 MiB a-bar = 2 x 8): the runtime adds into .grad, keeping the head's input (delta^L's size)
    assert eager.param_grad_bytes == 2 * MIB - MIB
    bare = without_weight_grads(chunked)
    assert [s.weight_grad_bytes for s in bare.stages] == [0, 0]
    # where the gradients exist the eager option holds delta^L alone; the recomputing one is unchanged
    assert bare.stages[-1].options[0] == chunked.stages[-1].options[0]
    assert (bare.stages[-1].options[1].saved_bytes, bare.stages[-1].options[1].param_grad_bytes) == (2 * MIB, 0)
    bare.stages[-1].options[1].to_dict()  # still a valid option of a valid chain
    assert Chain.from_json(chunked.to_json()).stages[-1].options[1].param_grad_bytes == MIB


def test_half_precision_logits_keep_their_eager_gradients_held() -> None:
    """Under autocast the runtime cannot add into .grad (autograd rounds the product to the head's dtype
    first): an eager option of a loss with half-precision logits holds its gradients even without_weight_grads."""
    chain = Chain("c", MIB, (Stage(forward_ms=1.0, backward_ms=2.0, output_bytes=MIB, saved_bytes=3 * MIB,
                                   grad_bytes=MIB, name="b", modules=("h.0",)), _loss(24 * MIB)))
    head = LossHead("lm_head", logits_bytes=8 * MIB, forward_ms=3.0, weight_bytes=2 * MIB)
    eager = without_weight_grads(with_loss_options(chain, head, (8,))).stages[-1].options[1]
    assert eager.eager and (eager.saved_bytes, eager.param_grad_bytes) == (3 * MIB, 0)
