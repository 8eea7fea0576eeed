"""Per-layer costs of a ``torch.compile``'d model: a few iterations run eagerly, so module hooks fire.

A compiled graph runs no module hooks (dynamo traces them once; memprof's hooks do nothing while traced), so
a compiled step shows its totals and categories but no layers. The profiler therefore runs a few chosen
iterations under ``torch.compiler.set_stance("force_eager")``: the same model, eagerly, every module hook
firing, every layer's forward and backward costs recorded as for an eager model. Those costs are the ones a
schedule needs, since the executor runs its stages eagerly between compiled graphs
(:mod:`planner.executor.install`). The other iterations run compiled and keep their exact totals.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["DEFAULT_EAGER_ITERATIONS", "EagerPass", "eager_pass_supported"]

#: Iteration 0 compiles; the next two run eagerly: the planner takes medians over them.
DEFAULT_EAGER_ITERATIONS = (1, 2)


def eager_pass_supported() -> bool:
    """Whether this torch can run compiled code eagerly on demand (``torch.compiler.set_stance``, torch 2.6+)."""
    return hasattr(getattr(torch, "compiler", None), "set_stance")


class EagerPass:
    """Runs chosen iterations of compiled code eagerly, and restores the compiler's stance after each.

    Args:
        iterations: the iterations to run eagerly (their numbers as ``record_stats()`` counts them).
    """

    def __init__(self, iterations: Sequence[int] = DEFAULT_EAGER_ITERATIONS) -> None:
        self.iterations = tuple(sorted({int(i) for i in iterations}))
        self.ran: list[int] = []  # the iterations that did run eagerly
        self._stance: Any = None
        self._current: int | None = None

    @property
    def active(self) -> bool:
        """Whether the current iteration runs eagerly."""
        return self._stance is not None

    def begin(self, iteration: int) -> None:
        """Called as ``iteration`` starts: forces eager execution if it is one of the chosen iterations."""
        if iteration not in self.iterations or self._stance is not None:
            return
        if not eager_pass_supported():
            warnings.warn(
                f"this torch ({torch.__version__}) has no torch.compiler.set_stance (torch 2.6+), so memprof cannot "
                "run an iteration of the compiled model eagerly: the trace has no per-layer costs. Profile the "
                "eager model (model._orig_mod) for them", RuntimeWarning, stacklevel=4)
            self.iterations = ()
            return
        self._stance = torch.compiler.set_stance("force_eager")
        self._current = iteration

    def end(self) -> None:
        """Called as an iteration ends: gives the compiler back the stance it had (idempotent)."""
        if self._stance is None:
            return
        self._stance.__exit__(None, None, None)
        self._stance = None
        if self._current is not None:
            self.ran.append(self._current)
        self._current = None
