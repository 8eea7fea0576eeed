"""The chunked loss (:mod:`planner.executor.chunked_loss`) installed in place on a Hugging Face causal LM.

A causal LM's ``forward`` runs ``logits = self.lm_head(hidden)`` and then
``self.loss_function(logits, labels, vocab_size, **kwargs)``. While :class:`ChunkedHead` is installed, a
training forward that is given ``labels=`` (or ``shift_labels=``) with gradients enabled gets, from the
head, a :class:`DeferredLogits` instead of the logits: a tensor of the logits' shape and dtype that owns no
memory and remembers the head's input and parameters; the model's loss function, replaced on that instance,
recognises it and computes the loss with :func:`~planner.executor.chunked_loss.chunked_causal_lm_loss`.
Any other use of the deferred logits (a model that scales them, a callback that reads ``outputs.logits``)
raises :class:`DeferredLogitsError` saying why: never a silently different value. Every other forward
(evaluation, generation, no labels, ``torch.no_grad``) runs the head and the loss as written.

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from planner.executor.chunked_loss import IGNORE_INDEX, chunked_causal_lm_loss

_ATTRIBUTE = "_memprof_chunked_head"


class DeferredLogitsError(RuntimeError):
    """The deferred logits of a chunked head were used as a tensor."""


class DeferredLogits(torch.Tensor):
    """The logits a chunked head did not compute: their shape and dtype, no storage, and the head's inputs."""

    hidden: torch.Tensor
    head: nn.Linear

    @staticmethod
    def __new__(cls, hidden: torch.Tensor, head: nn.Linear) -> DeferredLogits:
        dtype = hidden.dtype if not torch.is_autocast_enabled(hidden.device.type) else \
            torch.get_autocast_dtype(hidden.device.type)
        shape = (*hidden.shape[:-1], head.out_features)
        made = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=hidden.device)
        made.hidden, made.head = hidden, head
        return made

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]  # the default runs ops
        return f"DeferredLogits(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),  # type: ignore[override]
                           kwargs: Any = None) -> Any:
        raise DeferredLogitsError(
            f"{func} was called on the logits of a language-model head whose loss memprof computes in chunks "
            "(the logits are never materialised while labels= are passed in training); remove the chunked loss "
            "(remove_chunked_head(model), or a schedule without a loss option) to read the logits, or compute "
            "them separately with torch.no_grad()"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]


class _HeadForward:
    """The head's ``forward`` while installed: deferred logits when armed, the head's own otherwise."""

    def __init__(self, owner: ChunkedHead, forward: Any) -> None:
        self.owner, self.forward = owner, forward

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.owner.armed and not args and not kwargs:
            self.owner.armed = False  # one loss per forward: a second call of the head runs as written
            return DeferredLogits(hidden, self.owner.head)
        return self.forward(hidden, *args, **kwargs)


class _LossFunction:
    """The model's ``loss_function`` while installed: the chunked loss for deferred logits."""

    def __init__(self, owner: ChunkedHead, original: Any) -> None:
        self.owner, self.original = owner, original

    def __call__(self, logits: Any = None, labels: Any = None, vocab_size: Any = None, **kwargs: Any) -> Any:
        if not isinstance(logits, DeferredLogits):
            return self.original(logits, labels, vocab_size, **kwargs)
        head, hidden = logits.head, logits.hidden
        chunk_tokens = self.owner.tokens_per_chunk(hidden.numel() // max(hidden.shape[-1], 1))
        return chunked_causal_lm_loss(
            hidden, head.weight, head.bias, labels, chunk_tokens,
            ignore_index=kwargs.get("ignore_index", IGNORE_INDEX),
            num_items_in_batch=kwargs.get("num_items_in_batch"), shift_labels=kwargs.get("shift_labels"),
            eager=self.owner.eager)


class ChunkedHead:
    """Computes a Hugging Face causal LM's head and loss in chunks of tokens while installed.

    Args:
        model: the causal LM (it has ``get_output_embeddings()``, an ``nn.Linear``, and a ``loss_function``).
        chunk_tokens: tokens whose logits live at once; or
        chunks: the number of chunks each batch's tokens are split into (what a planned loss option says:
            its memory is a fraction of the logits whatever the batch's shape).
        eager: compute the gradients in the loss's forward instead of recomputing the logits in its backward
            (:func:`~planner.executor.chunked_loss.chunked_linear_cross_entropy`).

    Raises:
        ValueError: the model has no linear output head or no ``loss_function``, or not exactly one of
            ``chunk_tokens`` and ``chunks`` is a whole number > 0.
    """

    def __init__(self, model: nn.Module, chunk_tokens: int | None = None, chunks: int | None = None,
                 eager: bool = False) -> None:
        given = [(name, value) for name, value in (("chunk_tokens", chunk_tokens), ("chunks", chunks))
                 if value is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of chunk_tokens= (tokens per chunk) and chunks= (chunks per batch)")
        name, value = given[0]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a whole number > 0, found {value!r}")
        getter = getattr(model, "get_output_embeddings", None)
        head = getter() if callable(getter) else None
        if not isinstance(head, nn.Linear) or not hasattr(model, "loss_function"):
            raise ValueError(
                f"a chunked loss needs a Hugging Face causal LM (get_output_embeddings() an nn.Linear and a "
                f"loss_function); {type(model).__name__} has {type(head).__name__} as its output head. For "
                "another model, call planner.executor.chunked_loss.chunked_linear_cross_entropy in the loss")
        config = getattr(model, "config", None)
        altered = [key for key in ("final_logit_softcapping", "logits_scaling", "logit_scale")
                   if getattr(config, key, None) not in (None, 1, 1.0)]
        if altered:
            raise ValueError(f"{type(model).__name__} changes its logits after the head ({', '.join(altered)} in its "
                             "config), which a chunked loss would skip; plan it with loss_chunks=() instead")
        loss_function = getattr(model, "loss_function", None)
        if getattr(loss_function, "__name__", "") != "ForCausalLMLoss":
            raise ValueError(f"{type(model).__name__}'s loss_function is {loss_function!r}, not transformers' "
                             "ForCausalLMLoss, whose semantics the chunked loss reproduces; plan it with "
                             "loss_chunks=() instead")
        self.model, self.head = model, head
        self.chunk_tokens, self.chunks, self.eager = chunk_tokens, chunks, bool(eager)
        self.armed = False
        self.handles: list[Any] = []
        self.had_loss_function = "_loss_function" in model.__dict__

    def tokens_per_chunk(self, tokens: int) -> int:
        """The chunk size for a batch of ``tokens`` tokens (at least 1)."""
        if self.chunk_tokens is not None:
            return self.chunk_tokens
        return max(1, -(-tokens // (self.chunks or 1)))

    def install(self) -> None:
        """Replaces the head's ``forward`` and the model's ``loss_function`` on these instances."""
        if isinstance(self.head.__dict__.get("forward"), _HeadForward):
            raise ValueError("this model's head already computes its loss in chunks; call remove_chunked_head first")
        head: nn.Module = self.head  # its forward is replaced on this instance only, as the executor's stages
        head.forward = _HeadForward(self, head.forward)
        model: Any = self.model  # a Hugging Face model: loss_function is a property with a setter
        model.loss_function = _LossFunction(self, model.loss_function)
        self.handles = [self.model.register_forward_pre_hook(self._arm, with_kwargs=True),
                        self.model.register_forward_hook(self._disarm, always_call=True)]

    def remove(self) -> None:
        """Gives the head its ``forward`` and the model its ``loss_function`` back."""
        for handle in self.handles:
            handle.remove()
        self.head.__dict__.pop("forward", None)
        loss_function = self.model.__dict__.get("_loss_function")
        if isinstance(loss_function, _LossFunction):
            if self.had_loss_function:
                model: Any = self.model
                model.loss_function = loss_function.original
            else:
                del self.model.__dict__["_loss_function"]

    def _arm(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        labelled = kwargs.get("labels") is not None or kwargs.get("shift_labels") is not None
        self.armed = labelled and module.training and torch.is_grad_enabled()

    def _disarm(self, *_: Any) -> None:
        self.armed = False


def install_chunked_head(model: nn.Module, chunk_tokens: int | None = None, chunks: int | None = None,
                         eager: bool = False) -> ChunkedHead:
    """Installs a :class:`ChunkedHead` on ``model`` (replacing one already there) and returns it."""
    remove_chunked_head(model)
    installed = ChunkedHead(model, chunk_tokens, chunks, eager)
    installed.install()
    object.__setattr__(model, _ATTRIBUTE, installed)
    return installed


def remove_chunked_head(model: nn.Module) -> nn.Module:
    """Removes the chunked head ``model`` has (a no-op without one)."""
    installed = model.__dict__.pop(_ATTRIBUTE, None)
    if installed is not None:
        installed.remove()
    return model
