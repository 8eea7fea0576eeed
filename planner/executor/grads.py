"""How a stage's gradients are handed on: the recorded output's gradient edge, and gradients freed as soon as
their first consumer has used them, as plain autograd frees them.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def steal(grad: torch.Tensor) -> torch.Tensor:
    """A tensor holding ``grad``'s memory, ``grad`` itself left empty.

    Autograd and Python frames keep references to the gradients a backward receives until it returns; plain
    autograd frees delta^l as soon as the stage's first operation has used it. Moving the storage to a new
    tensor that only the next consumer holds frees it as early here.
    """
    base = grad._base
    if not grad.is_contiguous() or (base is not None and (base._base is not None or base.numel() != grad.numel())):
        return grad  # part of a larger tensor: that one holds the memory anyway
    moved = grad.detach()
    grad.set_()  # type: ignore[call-overload]  # no source: the tensor lets go of its storage
    if base is not None:
        base.set_()  # type: ignore[call-overload]
    return moved


def backward_freeing_grad(root: Any, grad: torch.Tensor, extra: Sequence[tuple[Any, torch.Tensor]] = ()) -> None:
    """``torch.autograd.backward(root, grad)``, with ``grad``'s memory freed once its first consumer ran.

    ``extra``: more (root, gradient) pairs run in the same backward (a stage's secondary outputs).
    """
    node = getattr(root, "node", None)
    handle = None
    if node is not None and hasattr(node, "register_hook"):
        # after the first node has used the gradient, nothing else needs it: empty it where it is held
        handle = node.register_hook(free_used_grads)
    try:
        torch.autograd.backward([root, *(r for r, _ in extra)], [grad, *(g for _, g in extra)])
    finally:
        if handle is not None:
            handle.remove()


def free_used_grads(grad_inputs: Sequence[torch.Tensor | None], grad_outputs: Sequence[torch.Tensor | None]) -> None:
    """Empties the gradients a node has used, unless it passed them on (an addition hands its own through)."""
    passed = {g.untyped_storage().data_ptr() for g in grad_inputs if g is not None}
    for grad in grad_outputs:
        if grad is not None and grad.untyped_storage().data_ptr() not in passed:
            steal(grad)


class Recorded:
    """What ``B(l)`` needs of a recorded output: the root to run backward from (``None``: no gradient) and
    its shape. Holding a gradient edge instead of the tensor lets the tensor be freed when its users are done."""

    __slots__ = ("root", "shape")

    def __init__(self, root: object, shape: torch.Size) -> None:
        self.root, self.shape = root, shape

    @classmethod
    def of(cls, out: torch.Tensor) -> Recorded:
        return cls(gradient_root(out) if out.requires_grad else None, out.shape)


def gradient_root(out: torch.Tensor) -> object:
    get_edge = getattr(torch.autograd.graph, "get_gradient_edge", None)  # torch >= 2.4
    if out.grad_fn is None or get_edge is None:
        return out
    return get_edge(out)
