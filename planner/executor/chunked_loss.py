"""A language-model head and its cross-entropy computed a chunk of tokens at a time.

Plain autograd materialises the head's logits (tokens x vocabulary) and, for the loss, their log-softmax,
and keeps both until the backward: at a 128k vocabulary that is more than every transformer block holds.
:class:`ChunkedLinearCrossEntropy` computes ``cross_entropy(hidden @ weight.T + bias, targets)`` over
``chunk_tokens`` rows at a time, so only one chunk's logits live at once; it saves only its inputs (the
hidden states, the weight, the targets) and recomputes each chunk's logits in the backward to produce the
gradients of the hidden states, the weight and the bias. The head's matrix product therefore runs twice
(forward and backward): the memory is paid for in time, as a stage option of the planner prices it.

The semantics are Hugging Face's causal-LM loss (``transformers.loss.loss_utils.ForCausalLMLoss``): the
labels are shifted by one (the last position predicts nothing), positions labelled ``ignore_index`` (-100)
count for nothing, the logits are upcast to float32 before the softmax, and the sum is divided by the
number of counted positions, or by ``num_items_in_batch`` when the caller passes it (gradient
accumulation over micro-batches). A weight shared with the input embedding (GPT-2 ties them) receives its
gradient through autograd, summed into the one Parameter like any other use.

Against plain autograd the results differ by float rounding only: the loss sums per-chunk sums, and the
weight's gradient sums per-chunk matrix products, in another order than one matrix product over every
token (docs/planner.md gives the tolerance the tests hold it to).

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from planner.executor.grad_into import (
    Contribution,
    Settlement,
    backward_target,
    direct_target,
    note_added,
    noted,
)

IGNORE_INDEX = -100
"""The label Hugging Face (and ``nn.CrossEntropyLoss``'s default) ignores."""


def shifted_targets(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The targets of a causal LM, flattened: position ``t`` predicts ``labels[..., t + 1]``, the last nothing.

    The same as ``ForCausalLMLoss``: pad the labels on the right with ``ignore_index`` and drop the first.
    """
    padded = F.pad(labels, (0, 1), value=ignore_index)
    return padded[..., 1:].reshape(-1)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            dtype: torch.dtype | None) -> torch.Tensor:
    """One chunk's logits in ``dtype`` (the dtype the forward's head produced: autocast's, if it was on)."""
    if dtype is not None and hidden.dtype != dtype:
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    return F.linear(hidden, weight, bias)


class _Gradients:
    """The gradients of the hidden states, the weight and the bias, filled one chunk at a time.

    They follow what plain autograd computes where the head runs in a lower precision than its parameters
    (under autocast): each chunk's products take the head's dtype (the weight cast to it once, not per chunk);
    the weight's (and bias's) gradient sums over every chunk in float32, as the one matrix product (or sum)
    over every token accumulates inside, and is then rounded once to the head's dtype, as that product's
    result is, before taking the parameter's dtype.
    """

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 needs: tuple[bool, ...], into: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> None:
        self.weight, self.bias = weight, bias
        self.dtype = weight.dtype  # the head's: the chunks' logits dtype once one is added
        self.cast: torch.Tensor | None = None
        self.hidden = torch.empty_like(hidden) if needs[0] else None
        # float32 sums (float64 for a float64 head), or straight into the existing .grad (planner.executor.grad_into)
        total = torch.promote_types(weight.dtype, torch.float32)
        self.into = into
        self.weight_grad = into[0] if into[0] is not None else (
            torch.zeros(weight.shape, dtype=total, device=weight.device) if needs[1] else None)
        self.bias_grad = into[1] if into[1] is not None else (
            torch.zeros(bias.shape, dtype=total, device=bias.device) if needs[2] and bias is not None else None)

    def weight_in(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype``, cast once and kept (a cast per chunk would copy it chunks times)."""
        if self.cast is None or self.cast.dtype != dtype:
            self.cast = self.weight.to(dtype)
        return self.cast

    def add(self, start: int, rows: torch.Tensor, grad_logits: torch.Tensor) -> None:
        """Adds one chunk's share, ``grad_logits`` being d(loss)/d(logits) of ``rows``, in the head's dtype."""
        self.dtype = grad_logits.dtype
        if self.hidden is not None:
            self.hidden[start:start + rows.shape[0]] = grad_logits @ self.weight_in(grad_logits.dtype)
        if self.weight_grad is not None:  # out= rather than addmm_: FLOP counters see aten.addmm, not addmm_
            total = self.weight_grad.dtype
            torch.addmm(self.weight_grad, grad_logits.t().to(total), rows.to(grad_logits.dtype).to(total),
                        out=self.weight_grad)
        if self.bias_grad is not None:
            self.bias_grad += grad_logits.sum(dim=0, dtype=self.bias_grad.dtype)

    def results(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(grad hidden, grad weight, grad bias)`` in the inputs' dtypes (``None`` where not needed, or where
        the gradient went straight into ``.grad``)."""
        weight = (self.weight_grad.to(self.dtype).to(self.weight.dtype)
                  if self.weight_grad is not None and self.into[0] is None else None)
        bias = (self.bias_grad.to(self.dtype).to(self.bias.dtype)
                if self.bias_grad is not None and self.bias is not None and self.into[1] is None else None)
        return self.hidden, weight, bias


def _grad_logits(probabilities: torch.Tensor, targets: torch.Tensor, ignore_index: int, scale: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """d(scale x summed cross-entropy)/d(logits) = scale x (softmax - one_hot(target)), zero on ignored rows,
    computed in place in ``probabilities`` (float32 softmax of one chunk) and returned in ``dtype``."""
    counted = targets != ignore_index
    where = counted.nonzero().squeeze(1)
    probabilities[where, targets[where]] -= 1.0
    probabilities *= (counted.to(torch.float32) * scale).unsqueeze(1)
    return probabilities.to(dtype)


def _divisor(targets: torch.Tensor, ignore_index: int, divisor: Any, device: torch.device) -> torch.Tensor:
    """What the summed loss is divided by: ``divisor`` if given, else the counted targets (float32)."""
    if divisor is None:
        divisor = (targets != ignore_index).sum()
    return torch.as_tensor(divisor, device=device).to(torch.float32)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum(cross_entropy(hidden @ weight.T + bias, targets)) / divisor``, ``chunk_tokens`` rows at a time.

    Inputs: ``hidden`` (tokens, features), ``weight`` (vocabulary, features), ``bias`` (vocabulary) or
    ``None``, ``targets`` (tokens,) int64, ``chunk_tokens``, ``ignore_index``, ``divisor`` (a tensor or a
    number; ``None``: the number of targets that are not ``ignore_index``). Keeps its inputs only; the
    backward recomputes each chunk's logits.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_tokens: int, ignore_index: int, divisor: Any) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        dtype = hidden.dtype
        for start in range(0, hidden.shape[0], chunk_tokens):
            logits = _logits(hidden[start:start + chunk_tokens], weight, bias, None)
            dtype = logits.dtype
            total += F.cross_entropy(logits.float(), targets[start:start + chunk_tokens], ignore_index=ignore_index,
                                     reduction="sum")
            del logits  # the next chunk's logits take this one's memory
        divisor = _divisor(targets, ignore_index, divisor, hidden.device)
        ctx.save_for_backward(hidden, weight, bias, targets, divisor)
        ctx.chunk_tokens, ctx.ignore_index, ctx.dtype = chunk_tokens, ignore_index, dtype
        return total / divisor

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> Any:
        hidden, weight, bias, targets, divisor = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        # the head's gradients go straight into an existing .grad (no forward side effect: nothing to settle)
        into = (backward_target(weight, ctx.dtype) if needs[1] else None,
                backward_target(bias, ctx.dtype) if needs[2] else None)
        noted_before = [grad is not None and noted(grad) for grad in into]
        grads = _Gradients(hidden, weight, bias, needs, into)
        _replay(grads, hidden, targets, ctx.chunk_tokens, ctx.ignore_index, grad_loss.to(torch.float32) / divisor,
                ctx.dtype)
        for grad, ours in zip(into, noted_before, strict=True):
            if grad is not None and ours:  # a pending eager loss's contribution stays valid
                note_added(grad)
        return (*grads.results(), None, None, None, None)


def _replay(grads: _Gradients, hidden: torch.Tensor, targets: torch.Tensor, step: int, ignore_index: int,
            scale: torch.Tensor, dtype: torch.dtype) -> None:
    """Adds every chunk's gradients to ``grads``, each chunk's logits computed again."""
    for start in range(0, hidden.shape[0], step):
        rows = hidden[start:start + step]
        # a half-precision chunk's logits are freed once their float32 copy exists; exp of
        # the log-softmax, as cross-entropy's backward computes it (softmax rounds a few values otherwise)
        logits = _logits(rows, grads.weight_in(dtype), grads.bias, dtype).float()
        probabilities = torch.log_softmax(logits, dim=-1).exp_()
        del logits
        grads.add(start, rows, _grad_logits(probabilities, targets[start:start + step], ignore_index, scale, dtype))
        del probabilities


def _head_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype the head computes in, or ``None`` when autocast decides it (then no gradient goes into .grad)."""
    if torch.is_autocast_enabled(hidden.device.type) or hidden.dtype != weight.dtype:
        return None
    return weight.dtype


class EagerChunkedLinearCrossEntropy(torch.autograd.Function):
    """:class:`ChunkedLinearCrossEntropy` that computes the gradients in its forward, chunk by chunk.

    No logits are recomputed (the head's FLOPs are plain autograd's); instead the gradient of the hidden
    states is allocated in the forward and kept until the backward, which scales it by the loss's incoming
    gradient (1 for ``loss.backward()``) and hands it over. The head's weight (and bias) gradient goes straight
    into the parameter's existing ``.grad`` where :mod:`planner.executor.grad_into` allows it, so it is never
    held; otherwise (no ``.grad`` yet, autocast, DDP) it is held like the hidden states' and handed over, which
    in a training step, where the loss's backward follows its forward at once, allocates it no earlier than
    autograd's own head backward would.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_tokens: int, ignore_index: int, divisor: Any) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        divisor = _divisor(targets, ignore_index, divisor, hidden.device)
        scale = 1.0 / divisor
        needs = ctx.needs_input_grad[:3]
        head = _head_dtype(hidden, weight)
        into = (direct_target(weight, head) if needs[1] and head else None,
                direct_target(bias, head) if needs[2] and head else None)
        grads = _Gradients(hidden, weight, bias, needs, into)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows, chunk_targets = hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens]
            logits = _logits(rows, weight, bias, None)
            dtype = logits.dtype
            log_probabilities = torch.log_softmax(logits.float(), dim=-1)
            del logits
            total += F.nll_loss(log_probabilities, chunk_targets, ignore_index=ignore_index, reduction="sum")
            grads.add(start, rows, _grad_logits(log_probabilities.exp_(), chunk_targets, ignore_index, scale, dtype))
            del log_probabilities
        ctx.grads = grads.results()  # not saved tensors: the backward scales them in place
        ctx.settlement = _settlement(into, hidden, weight, bias, targets, chunk_tokens, ignore_index, scale, dtype)
        return total / divisor

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> Any:
        grads, ctx.grads = ctx.grads, None  # a second backward has nothing to hand over (retain_graph)
        if grads is None:
            raise RuntimeError("the eager chunked loss hands its gradients over once; backward through it again "
                               "(retain_graph=True) is not supported: use the recomputing chunked loss")
        for grad in grads:
            if grad is not None:
                grad.mul_(grad_loss.to(grad.dtype))
        settlement, ctx.settlement = ctx.settlement, None
        hidden, weight, bias = grads
        if settlement is not None:
            direct = settlement.settle(grad_loss)
            weight, bias = (direct[0] if direct[0] is not None else weight), (direct[1] if direct[1] is not None else bias)
        return (hidden, weight, bias, None, None, None, None)


def _settlement(into: tuple[torch.Tensor | None, torch.Tensor | None], hidden: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, targets: torch.Tensor, step: int, ignore_index: int, scale: torch.Tensor,
                dtype: torch.dtype) -> Settlement | None:
    """What the backward (or a dropped graph) settles for the gradients added into ``.grad``, or ``None``."""
    if into == (None, None):
        return None
    for grad in into:
        if grad is not None:
            note_added(grad)

    def replay() -> tuple[torch.Tensor | None, torch.Tensor | None]:
        grads = _Gradients(hidden, weight, bias, (False, into[0] is not None, into[1] is not None))
        _replay(grads, hidden, targets, step, ignore_index, scale, dtype)
        return grads.weight_grad, grads.bias_grad

    params = (weight, bias)
    return Settlement(tuple(Contribution(p, g) if g is not None and p is not None else None
                            for p, g in zip(params, into, strict=True)), replay)


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 targets: torch.Tensor, chunk_tokens: int, ignore_index: int = IGNORE_INDEX,
                                 num_items_in_batch: Any = None, eager: bool = False) -> torch.Tensor:
    """The mean cross-entropy of a linear head's logits, one chunk of ``chunk_tokens`` tokens at a time.

    Args:
        hidden: the head's input, ``(..., features)``; every leading dimension is a token.
        weight: the head's weight, ``(vocabulary, features)`` (may be tied to an embedding).
        bias: the head's bias, or ``None``.
        targets: one class per token (as many as ``hidden`` has tokens), ``ignore_index`` where none counts.
        chunk_tokens: tokens whose logits live at once (> 0).
        ignore_index: the target that counts for nothing.
        num_items_in_batch: divide the summed loss by this instead of the number of counted tokens.
        eager: compute the gradients in the forward (:class:`EagerChunkedLinearCrossEntropy`: no recomputed
            logits, the gradients held from the loss's forward to its backward) instead of recomputing each
            chunk's logits in the backward (:class:`ChunkedLinearCrossEntropy`).

    Raises:
        ValueError: ``chunk_tokens`` is not positive, or ``targets`` does not give one class per token.
    """
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be a whole number of tokens > 0, found {chunk_tokens!r}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1).to(device=flat.device, dtype=torch.long)
    if flat_targets.shape[0] != flat.shape[0]:
        raise ValueError(f"targets give {flat_targets.shape[0]} classes for {flat.shape[0]} tokens of hidden "
                         f"states; expected one per token (shift a causal LM's labels with shifted_targets)")
    # without gradients (an evaluation with labels) an eager loss would compute them for nothing
    function = EagerChunkedLinearCrossEntropy if eager and torch.is_grad_enabled() else ChunkedLinearCrossEntropy
    loss: torch.Tensor = function.apply(flat, weight, bias, flat_targets, chunk_tokens, ignore_index,
                                        num_items_in_batch)
    return loss


def chunked_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           labels: torch.Tensor | None, chunk_tokens: int, ignore_index: int = IGNORE_INDEX,
                           num_items_in_batch: Any = None, shift_labels: torch.Tensor | None = None,
                           eager: bool = False) -> torch.Tensor:
    """Hugging Face's ``ForCausalLMLoss`` of ``lm_head(hidden)``, without the whole logits.

    Args:
        hidden: the last hidden states, ``(batch, sequence, features)``.
        weight, bias: the language-model head's parameters.
        labels: the unshifted labels, ``(batch, sequence)`` (ignored when ``shift_labels`` is given).
        chunk_tokens: tokens whose logits live at once.
        ignore_index: the label that counts for nothing.
        num_items_in_batch: as in ``ForCausalLMLoss``: divide the sum by it instead of the counted tokens.
        shift_labels: already shifted labels, as ``ForCausalLMLoss`` accepts them.
        eager: compute the gradients in the forward (see :func:`chunked_linear_cross_entropy`).

    Raises:
        ValueError: neither ``labels`` nor ``shift_labels`` is given, or they do not match ``hidden``.
    """
    if shift_labels is None:
        if labels is None:
            raise ValueError("the chunked causal-LM loss needs labels= (or shift_labels=)")
        shift_labels = shifted_targets(labels, ignore_index)
    return chunked_linear_cross_entropy(hidden, weight, bias, shift_labels, chunk_tokens, ignore_index,
                                        num_items_in_batch, eager)
