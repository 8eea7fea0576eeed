"""Embeddings whose backward adds its rows' gradients straight into the weight's existing ``.grad``.

Autograd's embedding backward materialises the weight's whole gradient (vocabulary x features: GPT-2 small's
tied 50,257 x 768 embedding, 147.2 MiB in float32) although a batch touches a few hundred rows; where ``.grad``
already exists (an earlier micro-batch's, ``zero_grad(set_to_none=False)``) ``AccumulateGrad`` then adds it in
and frees it, and a tied weight's two gradients are summed first: a transient as large as the weight, at the
very end of the backward, which sets the chain's minimum budget. :func:`install_embedding_grads` makes every plain
``nn.Embedding`` of a model add the batch's rows into ``.grad`` instead (each distinct token's rows summed
first, in order, then added once: autograd's result bitwise), under the rules of :mod:`planner.executor.grad_into`
(float32 or float64, no process group, observing hooks only, a backward that reaches ``.grad``); otherwise,
where ``.grad`` does not exist yet (the dense gradient then becomes ``.grad`` as autograd makes it) and under
``torch.compile``, the backward is autograd's own.

A tied weight (the language-model head's, in GPT-2) gets its other gradients through autograd, which sums them
before ``AccumulateGrad`` adds the sum into ``.grad``: adding the embedding's rows into ``.grad`` first would
reassociate that sum (``(g + rows) + head`` for autograd's ``g + (head + rows)``: float rounding in every touched
row under gradient accumulation). So a tied embedding hands autograd its rows as a sparse gradient of the
batch's distinct tokens instead: autograd adds it to the head's gradient, row by row as its dense gradient would
be, and ``.grad`` gets autograd's sum, bitwise; still no whole-weight gradient of its own.

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.executor.grad_into import backward_target, note_added, noted

_EMBEDDING_ATTRIBUTE = "_memprof_embedding_grads"


class _Embedding(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient goes into ``.grad`` where it can."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None,
                tied: bool = False) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.tied = weight, padding_idx, tied
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        (ids,) = ctx.saved_tensors
        weight, padding = ctx.weight, ctx.padding_idx
        if not ctx.needs_input_grad[1]:
            return None, None, None, None
        target = backward_target(weight, grad_out.dtype)
        if target is None:
            dense = torch.ops.aten.embedding_dense_backward(grad_out, ids, weight.shape[0],
                                                            -1 if padding is None else padding, False)
            return None, dense, None, None
        flat, rows = ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1])
        if padding is not None:  # the padding row's gradient is zero, as in autograd's
            keep = flat != padding
            flat, rows = flat[keep], rows[keep]
        # each row's tokens summed first, in order, as autograd's dense gradient sums them, then added once:
        # autograd's result bitwise, with a buffer of the batch's distinct tokens instead of the whole vocabulary
        distinct, where = torch.unique(flat, return_inverse=True)
        sums = torch.zeros((distinct.shape[0], rows.shape[1]), dtype=rows.dtype, device=rows.device)
        sums.index_add_(0, where, rows)
        if ctx.tied:  # autograd sums it with the weight's other gradients, as it does the dense one (docstring)
            sparse = torch.sparse_coo_tensor(distinct.unsqueeze(0), sums.to(target.dtype), weight.shape,
                                             is_coalesced=True, check_invariants=False)
            return None, sparse, None, None
        ours = noted(target)  # only our own additions so far: a pending eager loss's contribution stays valid
        target.index_add_(0, distinct, sums.to(target.dtype))
        if ours:
            note_added(target)
        return None, None, None, None


class _EmbeddingForward:
    """The forward an embedding gets: its own where it has options the direct backward does not follow."""

    def __init__(self, module: nn.Embedding, tied: bool = False) -> None:
        self.module = module
        self.tied = tied

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        m = self.module
        # under torch.compile the embedding is traced as written: the direct backward's checks of .grad are
        # Python state that a compiled graph would not re-run
        if (m.max_norm is not None or m.scale_grad_by_freq or m.sparse or not torch.is_grad_enabled()
                or torch.compiler.is_compiling()):
            return type(m).forward(m, ids)
        out: torch.Tensor = _Embedding.apply(ids, m.weight, m.padding_idx, self.tied)
        return out


def install_embedding_grads(model: nn.Module) -> int:
    """Gives every ``nn.Embedding`` of ``model`` the direct backward (an instance ``forward``); returns how many.

    Undone by :func:`remove_embedding_grads`; a second call changes nothing.
    """
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    count = 0
    for module in model.modules():
        if type(module) is nn.Embedding and "forward" not in vars(module):
            tied = uses.get(id(module.weight), 0) > 1
            module.forward = _EmbeddingForward(module, tied)  # type: ignore[method-assign,assignment]
            setattr(module, _EMBEDDING_ATTRIBUTE, True)
            count += 1
    return count


def remove_embedding_grads(model: nn.Module) -> None:
    """Gives the embeddings :func:`install_embedding_grads` changed their class's ``forward`` back."""
    for module in model.modules():
        if vars(module).pop(_EMBEDDING_ATTRIBUTE, False):
            vars(module).pop("forward", None)
