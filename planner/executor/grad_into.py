"""A parameter's gradient added straight into its existing ``.grad``, where autograd would add it later.

Where a parameter's ``.grad`` already exists (gradient accumulation over micro-batches, ``zero_grad(set_to_none=
False)``, any step after the first without ``zero_grad``), autograd's ``AccumulateGrad`` adds each new gradient
into it in place, but only after the gradient has been materialised in full. The eager chunked loss
(:mod:`planner.executor.chunked_loss`) computes its head's weight gradient in the loss's forward; materialised,
that gradient (GPT-2 small's tied 50,257 x 768 embedding: 148.7 MiB in float32) would be held from the forward
to the backward. Added into ``.grad`` chunk by chunk as it is computed, it costs nothing.

That is done only where the result is what autograd computes (up to the order of the float32 sums):

* the parameter is a float32 or float64 leaf whose ``.grad`` is a dense contiguous tensor of its dtype and
  device, and the head runs in that dtype (not under autocast: there autograd rounds the product to the
  head's dtype first);
* no process group is initialised (DDP and FSDP reduce gradients from ``AccumulateGrad``'s hooks), and every
  post-accumulate-grad hook of the parameter only observes (it carries ``observes_only = True``, as memprof's
  profiler's do): they are called once the contribution is in, in the backward;
* nothing else writes ``.grad`` between the forward and the backward. Each ``.grad`` remembers its version after
  the last addition made here; the backward checks it. ``zero_grad()`` (to ``None``) in between is handled: the
  contribution went with the old ``.grad`` and is computed again. An in-place write in between (``zero_grad
  (set_to_none=False)``, an optimizer step, another loss's backward) cannot be told from an addition, and is
  refused with an error that says what to do;
* the backward is ``loss.backward()`` with gradient 1, reaching the parameter: a scaled loss (``GradScaler``),
  ``torch.autograd.grad`` or ``backward(inputs=...)`` get the contribution computed again and corrected, and a
  forward whose graph is dropped without a backward takes its contribution back out of ``.grad``.

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

_ADDED_AT: Any = WeakTensorKeyDictionary()
"""``.grad`` tensor -> its version right after the last contribution added into it here."""

_DIRECT_DTYPES = (torch.float32, torch.float64)


def _hooks_only_observe(param: torch.Tensor) -> bool:
    hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
    return all(getattr(hook, "observes_only", False) for hook in hooks.values())


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def direct_target(param: torch.Tensor | None, compute_dtype: torch.dtype) -> torch.Tensor | None:
    """The ``.grad`` to add ``param``'s gradient into as it is computed, or ``None`` to hand it to autograd.

    Args:
        param: the parameter (``None``: there is none, e.g. a head without bias).
        compute_dtype: the dtype its gradient is computed in (the head's: autocast's when it is on).
    """
    if param is None or not param.requires_grad or param.grad_fn is not None or _distributed():
        return None
    grad = param.grad
    if (grad is None or compute_dtype != param.dtype or param.dtype not in _DIRECT_DTYPES
            or grad.dtype != param.dtype or grad.device != param.device or grad.shape != param.shape
            or grad.layout != torch.strided or not grad.is_contiguous() or not _hooks_only_observe(param)):
        return None
    return grad


def note_added(grad: torch.Tensor) -> None:
    """Records that a contribution was just added into ``grad`` (its version now)."""
    _ADDED_AT[grad] = grad._version


def noted(grad: torch.Tensor) -> bool:
    """Whether ``grad`` holds contributions added here and nothing else wrote it since the last of them."""
    return bool(_ADDED_AT.get(grad) == grad._version)


class Contribution:
    """A gradient added into ``param.grad`` in a forward, not yet accounted for by a backward.

    Attributes:
        param: the parameter.
        grad: a weak reference to the ``.grad`` it went into (an old ``.grad`` dropped by ``zero_grad`` is
            not kept alive by it).
    """

    def __init__(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        self.param = param
        self.grad = weakref.ref(grad)

    def state(self) -> str:
        """``"intact"``: ``.grad`` holds the contribution and nothing else wrote it since; ``"gone"``: ``.grad``
        is another tensor (or ``None``), the contribution went with the old one; ``"overwritten"``: written in
        place by something else since, whether the contribution is still in it cannot be told."""
        grad = self.grad()
        if grad is None or self.param.grad is not grad:
            return "gone"
        return "intact" if noted(grad) else "overwritten"

    def reaches_grad(self) -> bool:
        """Whether the running backward accumulates into ``param.grad`` (``loss.backward()`` does;
        ``torch.autograd.grad`` and ``backward(inputs=...)`` without it do not)."""
        node = torch.autograd.graph.get_gradient_edge(self.param).node
        try:
            return bool(torch._C._will_engine_execute_node(node))
        except RuntimeError:  # torch.autograd.grad(): it never accumulates into .grad
            return False


def backward_target(param: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``param``'s existing ``.grad`` to add into from a backward (no forward side effect, nothing to settle):
    :func:`direct_target`'s, where the running backward accumulates into it (``loss.backward()``, not
    ``torch.autograd.grad``); else ``None``."""
    target = direct_target(param, dtype)
    return target if target is not None and param is not None and Contribution(param, target).reaches_grad() else None


class OverwrittenGradError(RuntimeError):
    """A ``.grad`` that a forward added into was written in place before that forward's backward."""


def overwritten_error(name: str) -> OverwrittenGradError:
    """The error for a ``.grad`` written in place between the forward that added into it and its backward."""
    return OverwrittenGradError(
        f"the eager chunked loss added the {name} gradient into .grad during the forward, and .grad was written "
        "in place before the loss's backward (zero_grad(set_to_none=False), an optimizer step, or another "
        "loss's backward): it cannot tell whether its contribution is still there. Call zero_grad() before the "
        "forward or with set_to_none=True, run each loss's backward before the next forward, or choose a "
        "recomputing loss option (memprof plan --no-loss-options for none)")


class Settlement:
    """The contributions one forward added into ``.grad``, settled by its backward or taken back without one.

    Args:
        contributions: one per parameter (``None`` where that parameter's gradient was not added directly).
        replay: computes the same contributions again, unscaled, as fresh tensors (same order and ``None``s).
        name: what the error messages call the gradients.
    """

    def __init__(self, contributions: tuple[Contribution | None, ...],
                 replay: Any, name: str = "language-model head's") -> None:
        self.contributions = contributions
        self.replay = replay
        self.name = name
        self.settled = False

    def settle(self, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """In the backward: what to hand autograd for each parameter (``None``: already in ``.grad``).

        With gradient 1 reaching ``.grad`` and every contribution intact, nothing is computed. Otherwise the
        contributions are computed again, taken out of ``.grad`` where they still are, and handed over scaled
        by ``grad_loss``, as autograd would have received them.

        Raises:
            OverwrittenGradError: ``.grad`` was written in place since the forward (:func:`overwritten_error`).
        """
        self.settled = True
        live = [c for c in self.contributions if c is not None]
        states = [c.state() for c in live]
        if "overwritten" in states:
            raise overwritten_error(self.name)
        if all(s == "intact" for s in states) and bool(grad_loss == 1) and all(c.reaches_grad() for c in live):
            return tuple(None for _ in self.contributions)
        again = self.replay()
        handed: list[torch.Tensor | None] = []
        for contribution, grad in zip(self.contributions, again, strict=True):
            if contribution is not None and grad is not None:
                self._take_back(contribution, grad)
                grad = grad.mul_(grad_loss.to(grad.dtype))
            handed.append(grad if contribution is not None else None)
        return tuple(handed)

    def take_back(self) -> None:
        """Without a backward (the graph dropped): removes the contributions still intact from ``.grad``."""
        if self.settled:
            return
        self.settled = True
        live = [c for c in self.contributions if c is not None]
        if not any(c.state() == "intact" for c in live):
            return
        with torch.no_grad():
            for contribution, grad in zip(self.contributions, self.replay(), strict=True):
                if contribution is not None and grad is not None and contribution.state() == "intact":
                    self._take_back(contribution, grad)

    @staticmethod
    def _take_back(contribution: Contribution, grad: torch.Tensor) -> None:
        if contribution.state() == "intact":
            target = contribution.grad()
            assert target is not None  # intact: the weak reference is alive
            target.sub_(grad)
            note_added(target)

    def __del__(self) -> None:
        try:
            self.take_back()
        except Exception as exc:  # noqa: BLE001 - a finaliser must not raise; say what was left
            warnings.warn(f"the eager chunked loss could not take its {self.name} gradient back out of .grad after a "
                          f"forward without backward ({exc}); the parameters' .grad may hold it", RuntimeWarning,
                          stacklevel=1)
