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
from torch import nn

__all__ = ["DEFAULT_EAGER_ITERATIONS", "EagerPass", "eager_pass_supported", "unwrap_compiled"]

#: Iteration 0 compiles; the next two run eagerly: the planner takes medians over them.
DEFAULT_EAGER_ITERATIONS = (1, 2)


def eager_pass_supported() -> bool:
    """Whether this torch can run compiled code eagerly on demand (``torch.compiler.set_stance``, torch 2.6+)."""
    return hasattr(getattr(torch, "compiler", None), "set_stance")


def unwrap_compiled(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The eager model inside a ``torch.compile``'d one, and the compiled wrapper (``None`` if not compiled).

    The profiler names layers after the eager model (``transformer.h.0``, not ``_orig_mod.transformer.h.0``),
    so a schedule planned from the trace applies to either, and hooks the wrapper as the root: its hooks run
    outside the compiled graph (no graph break, ``fullgraph=True`` still compiles), so every compiled step
    still has its forward, backward and optimizer phases, and its categories, exactly.
    """
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module) and type(model).__name__ == "OptimizedModule":
        return inner, model
    return model, None


class EagerPass:
    """Runs chosen iterations of a compiled model eagerly, and restores the compiler's stance after each.

    A model handed over compiled is known at once; one compiled after the profiler attached (``torch.compile``
    over the profiled model) is recognised at the end of iteration 0, where no module hook fired although
    memory was allocated. Its compiled iterations then have no phases either (the root's hooks are inside
    the graph): their activations read as ``other``, which the warning says.

    Args:
        compiled: the model was handed over compiled.
        iterations: the iterations to run eagerly (their numbers as ``record_stats()`` counts them).
    """

    def __init__(self, compiled: bool, iterations: Sequence[int] = DEFAULT_EAGER_ITERATIONS) -> None:
        self.compiled = compiled
        self.iterations = tuple(sorted({int(i) for i in iterations}))
        self.ran: list[int] = []  # the iterations that did run eagerly
        self._stance: Any = None
        self._current: int | None = None
        if compiled:
            self._warn("this model is torch.compile'd")

    @property
    def active(self) -> bool:
        """Whether the current iteration runs eagerly."""
        return self._stance is not None

    def meta(self) -> dict[str, Any]:
        """What ``meta.json`` says of it: ``compiled`` and the ``eager_iterations`` that ran."""
        return {"compiled": self.compiled, "eager_iterations": list(self.ran)} if self.compiled else {}

    def after_iteration(self, iteration: int, forward_modules: set[int], allocated: bool) -> bool:
        """Ends ``iteration`` and prepares the next one.

        Args:
            iteration: the iteration that just ended.
            forward_modules: the modules (indices, 0 the root) whose forward hook fired in it.
            allocated: whether the allocator saw memory allocated in it.

        Returns:
            Whether the iterations that ran eagerly changed (``meta.json`` is then written again).
        """
        ran = len(self.ran)
        self.end()
        if iteration == 0 and not self.compiled and allocated and not forward_modules:
            self.compiled = True
            self._warn("no module hook fired in iteration 0 while memory was allocated: the model runs compiled "
                       "(torch.compile over the profiled model) or scripted. In its compiled iterations no phase is "
                       "seen, so activations read as 'other'; hand the profiler the compiled model "
                       "(MemoryProfiler(torch.compile(model), ...)) to keep them apart")
        if self.compiled:
            self._begin(iteration + 1)
        return len(self.ran) != ran

    def _warn(self, why: str) -> None:
        chosen = " and ".join(str(i) for i in self.iterations)
        warnings.warn(
            f"{why}: compiled graphs run no module hooks, so memprof runs iteration(s) {chosen} eagerly "
            "(torch.compiler.set_stance('force_eager')) for per-layer costs and the planner's chain (meta.json: "
            "eager_iterations); the other iterations keep exact totals and categories, without per-layer rows",
            RuntimeWarning, stacklevel=5)

    def _begin(self, iteration: int) -> None:
        if iteration not in self.iterations or self._stance is not None:
            return
        if not eager_pass_supported():
            warnings.warn(
                f"this torch ({torch.__version__}) has no torch.compiler.set_stance (torch 2.6+), so memprof cannot "
                "run an iteration of the compiled model eagerly: the trace has no per-layer costs. Profile the "
                "eager model (model._orig_mod) for them", RuntimeWarning, stacklevel=5)
            self.iterations = ()
            return
        self._stance = torch.compiler.set_stance("force_eager")
        self._current = iteration

    def end(self) -> None:
        """Gives the compiler back the stance it had (idempotent; also called at ``close()``)."""
        if self._stance is None:
            return
        self._stance.__exit__(None, None, None)
        self._stance = None
        if self._current is not None:
            self.ran.append(self._current)
        self._current = None
