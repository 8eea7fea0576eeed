"""The eager chunked loss adding its head's gradients straight into an existing ``.grad`` (planner.executor.grad_into).

Oracle: plain autograd on the same inputs (``F.linear`` then ``F.cross_entropy``), whatever the caller does
between the forward and the backward: a scaled loss, ``torch.autograd.grad``, ``zero_grad`` in between, a
forward whose graph is dropped; and the CPU allocator for what the forward holds. Tolerance as in
test_chunked_loss.py (float32 sums taken in another order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from planner.executor.chunked_head import install_chunked_head, remove_chunked_head
from planner.executor.chunked_loss import chunked_linear_cross_entropy
from planner.executor.grad_into import OverwrittenGradError, direct_target
from planner.measure.compile_baseline import memory_events
from tests.planner import real_models as R

RTOL, ATOL = 1e-5, 1e-6
VOCAB, FEATURES, TOKENS = 64, 16, 40


def _inputs() -> tuple[torch.Tensor, torch.nn.Parameter, torch.nn.Parameter, torch.Tensor]:
    torch.manual_seed(0)
    hidden = torch.randn(TOKENS, FEATURES)
    weight = torch.nn.Parameter(torch.randn(VOCAB, FEATURES) / 4)
    bias = torch.nn.Parameter(torch.randn(VOCAB) / 4)
    targets = torch.randint(0, VOCAB, (TOKENS,))
    targets[::7] = -100
    for param in (weight, bias):
        param.grad = torch.randn_like(param)  # an earlier micro-batch's
    return hidden, weight, bias, targets


def _run(chunked: bool, step: Callable[..., Any]) -> tuple[torch.Tensor, ...]:
    """``step(loss, hidden, weight, bias)`` after the loss's forward; returns the gradients it leaves."""
    hidden, weight, bias, targets = _inputs()
    hidden.requires_grad_()
    if chunked:
        loss = chunked_linear_cross_entropy(hidden, weight, bias, targets, 6, eager=True)
    else:
        loss = F.cross_entropy(F.linear(hidden, weight, bias), targets)
    handed = step(loss, hidden, weight, bias)
    return (weight.grad, bias.grad, hidden.grad, *(handed or ()))


def _same(step: Callable[..., Any]) -> None:
    for got, want in zip(_run(True, step), _run(False, step), strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**-4])
def test_into_existing_grads_matches_plain_autograd_for_any_loss_scale(scale: float) -> None:
    """A GradScaler's or an accumulation's scaled loss: the contribution is computed again and corrected."""
    _same(lambda loss, *_: (loss * scale).backward())


def test_autograd_grad_and_backward_inputs_leave_grad_alone() -> None:
    _same(lambda loss, hidden, weight, bias: torch.autograd.grad(loss, [weight, bias, hidden]))
    _same(lambda loss, hidden, *_: loss.backward(inputs=[hidden]))


def test_zero_grad_between_forward_and_backward() -> None:
    def to_none(loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
        weight.grad, bias.grad = None, None
        loss.backward()

    _same(to_none)

    def in_place(loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
        weight.grad.zero_()
        loss.backward()

    with pytest.raises(OverwrittenGradError, match=r"set_to_none=False.*recomputing loss option"):
        _run(True, in_place)


def test_a_forward_without_backward_leaves_grad_as_it_was() -> None:
    hidden, weight, bias, targets = _inputs()
    before = weight.grad.clone(), bias.grad.clone()
    loss = chunked_linear_cross_entropy(hidden.requires_grad_(), weight, bias, targets, 6, eager=True)
    assert not torch.equal(weight.grad, before[0])  # the forward added its share
    del loss  # e.g. a training_step that skips this batch
    torch.testing.assert_close(weight.grad, before[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(bias.grad, before[1], rtol=0, atol=1e-6)


def test_evaluation_without_gradients_computes_none() -> None:
    hidden, weight, bias, targets = _inputs()
    before = weight.grad.clone()
    with torch.no_grad():
        loss = chunked_linear_cross_entropy(hidden, weight, bias, targets, 6, eager=True)
    assert torch.equal(weight.grad, before)
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(hidden, weight, bias), targets))


def test_hooks_decide_whether_grad_is_written_directly() -> None:
    """A hook that acts on the gradient (DDP's kind) gets it through AccumulateGrad; an observer is called
    once the contribution is in, with the whole gradient."""
    for observes in (False, True):
        hidden, weight, bias, targets = _inputs()
        seen: list[torch.Tensor] = []

        def hook(param: torch.Tensor, seen: list[torch.Tensor] = seen) -> None:
            seen.append(param.grad.clone())

        hook.observes_only = observes  # type: ignore[attr-defined]
        weight.register_post_accumulate_grad_hook(hook)
        assert (direct_target(weight, torch.float32) is weight.grad) == observes
        chunked_linear_cross_entropy(hidden, weight, bias, targets, 6, eager=True).backward()
        assert len(seen) == 1 and torch.equal(seen[0], weight.grad)
    assert direct_target(bias, torch.bfloat16) is None  # a head computing in another dtype (autocast)
    bias.grad = None
    assert direct_target(bias, torch.float32) is None  # nothing to add into


def _held_after_forward(forward: Callable[[], torch.Tensor]) -> int:
    kept: list[torch.Tensor] = []
    _, deltas = memory_events(lambda: kept.append(forward()))
    kept[0].backward()
    return int(sum(deltas))


def test_the_forward_holds_no_weight_gradient_where_grad_exists() -> None:
    """Allocator truth on GPT-2 (tied head): the eager loss's forward holds the head's weight gradient when the
    parameters have no ``.grad``, and instead of it only the head's input when an earlier micro-batch's exists;
    the gradients of two accumulated micro-batches match plain autograd's."""
    real = R.gpt2(dropout=0.0)
    model: Any = real.model
    torch.manual_seed(3)
    batches = [real.make_batch(2) for _ in range(2)]

    def accumulate() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        for ids, labels in batches:
            model(input_ids=ids, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    reference = accumulate()
    install_chunked_head(model, 8, eager=True)
    try:
        got = accumulate()
        ids, labels = batches[0]
        held_into = _held_after_forward(lambda: model(input_ids=ids, labels=labels).loss)
        model.zero_grad(set_to_none=True)
        held_own = _held_after_forward(lambda: model(input_ids=ids, labels=labels).loss)
    finally:
        remove_chunked_head(model)
    for name, want in reference.items():
        torch.testing.assert_close(got[name], want, rtol=RTOL, atol=ATOL, msg=name)
    # instead it keeps what corrects .grad if the backward asks: the head's input, the shifted labels (int64)
    # and the loss's scale (one float32)
    expected = model.lm_head.weight.nbytes - ids.numel() * (model.config.n_embd * 4 + 8) - 4
    assert held_own - held_into == expected, (held_own, held_into, expected)


def test_memprofs_profiler_only_observes_gradients(tmp_path) -> None:  # noqa: ANN001
    """Under memprof's profiler (hooks on every parameter) the eager loss still adds into ``.grad``."""
    from memprof import MemoryProfiler

    hidden, weight, bias, targets = _inputs()
    model = torch.nn.Linear(FEATURES, VOCAB)
    model.weight, model.bias = weight, bias
    with MemoryProfiler(model, None, out_dir=tmp_path, print_period=0, background=False):
        assert direct_target(weight, torch.float32) is weight.grad
        reference = weight.grad.clone()
        chunked_linear_cross_entropy(hidden, weight, bias, targets, 6, eager=True).backward()
    plain = torch.nn.Parameter(weight.detach().clone())
    plain.grad = reference
    F.cross_entropy(F.linear(hidden, plain, bias.detach()), targets).backward()
    torch.testing.assert_close(weight.grad, plain.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_the_recomputing_loss_adds_into_existing_grads_in_its_backward(scale: float) -> None:
    """No forward side effect: its backward adds the head's gradients into ``.grad`` (a scaled loss included), and
    ``torch.autograd.grad`` gets them handed over."""
    hidden, weight, bias, targets = _inputs()
    before = weight.grad.clone()
    loss = chunked_linear_cross_entropy(hidden, weight, bias, targets, 6)
    assert torch.equal(weight.grad, before)  # the forward touched nothing
    (loss * scale).backward()
    plain_weight = torch.nn.Parameter(weight.detach().clone())
    plain_weight.grad = before
    (F.cross_entropy(F.linear(hidden, plain_weight, bias.detach()), targets) * scale).backward()
    torch.testing.assert_close(weight.grad, plain_weight.grad, rtol=RTOL, atol=ATOL)
    hidden, weight, bias, targets = _inputs()
    before = weight.grad.clone()
    handed, = torch.autograd.grad(chunked_linear_cross_entropy(hidden, weight, bias, targets, 6), [weight])
    assert torch.equal(weight.grad, before)
    torch.testing.assert_close(handed, torch.autograd.grad(F.cross_entropy(F.linear(hidden, weight, bias), targets),
                                                           [weight])[0], rtol=RTOL, atol=ATOL)
