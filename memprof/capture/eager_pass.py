"""Per-layer costs of a ``torch.compile``'d model: which iterations are costing iterations, and how they run.

A compiled graph runs no module hooks (dynamo traces them once; memprof's hooks do nothing while traced), so
a compiled step shows its totals and categories but no layers. The profiler therefore makes a few chosen
iterations costing iterations. Where the model has repeated blocks, they run compiled with each block as its
own region, marked around (:mod:`memprof.capture.regional`): the blocks' costs are the compiled code's, as a
schedule's stages run under compile (meta ``regional_iterations``). Where it has none, they run under
``torch.compiler.set_stance("force_eager")``: the same model, eagerly, every module hook firing (meta
``eager_iterations``). The other iterations run as compiled and keep their exact totals; only they headline
a report.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memprof.capture.regional import RegionalBlocks

__all__ = ["DEFAULT_EAGER_ITERATIONS", "EagerPass", "eager_pass_supported", "unwrap_compiled"]

#: Iteration 0 compiles; the next two are costing iterations: the planner takes medians over them.
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
        iterations: the costing iterations (their numbers as ``record_stats()`` counts them).
        regional: the model's repeated blocks, to compile as regions in the costing iterations of a model handed
            over compiled (``None`` or no blocks: they run eagerly).
    """

    def __init__(self, compiled: bool, iterations: Sequence[int] = DEFAULT_EAGER_ITERATIONS,
                 regional: RegionalBlocks | None = None) -> None:
        self.compiled = compiled
        self.iterations = tuple(sorted({int(i) for i in iterations}))
        self.ran: list[int] = []  # the costing iterations that ran eagerly
        self.ran_regional: list[int] = []  # the costing iterations that ran compiled, block by block
        self._regional = regional if regional is not None and regional.blocks and compiled else None
        self._stance: Any = None
        self._current: int | None = None
        if compiled:
            self._warn("this model is torch.compile'd")

    @property
    def active(self) -> bool:
        """Whether the current iteration is a costing iteration."""
        return self._stance is not None

    def meta(self) -> dict[str, Any]:
        """What ``meta.json`` says of it: ``compiled``, and the ``eager_iterations`` and ``regional_iterations``
        that ran."""
        if not self.compiled:
            return {}
        return {"compiled": True, "eager_iterations": list(self.ran),
                **({"regional_iterations": list(self.ran_regional)} if self.ran_regional else {})}

    def collects_garbage_after(self, iteration: int) -> bool:
        """Whether the profiler runs ``gc.collect()`` as ``iteration`` ends (before its allocator events are taken).

        Compiling leaves reference cycles that hold real tensors: a frame dynamo compiled keeps its locals (a
        step's logits, 512 KiB on the test GPT-2) alive until the garbage collector next runs, which depends on
        everything the process allocated before. A costing iteration that met them counted them as held by the
        step (a schedule's predicted peak +19% on that GPT-2, in some processes and not others). So garbage is
        collected before each costing iteration and after the last, where its own regions' compile garbage
        would otherwise reach the compiled iterations that headline. Its frees fall in the iteration that ends.
        """
        return self.compiled and bool(self.iterations) and (iteration + 1 in self.iterations
                                                            or iteration in self.iterations)

    def after_iteration(self, iteration: int, forward_modules: set[int], allocated: bool) -> bool:
        """Ends ``iteration`` and prepares the next one.

        Args:
            iteration: the iteration that just ended.
            forward_modules: the modules (indices, 0 the root) whose forward hook fired in it.
            allocated: whether the allocator saw memory allocated in it.

        Returns:
            Whether the costing iterations that ran changed (``meta.json`` is then written again).
        """
        ran = len(self.ran) + len(self.ran_regional)
        self.end()
        if iteration == 0 and not self.compiled and allocated and not forward_modules:
            self.compiled = True
            self._warn("no module hook fired in iteration 0 while memory was allocated: the model runs compiled "
                       "(torch.compile over the profiled model) or scripted. In its compiled iterations no phase is "
                       "seen, so activations read as 'other'; hand the profiler the compiled model "
                       "(MemoryProfiler(torch.compile(model), ...)) to keep them apart")
        if self.compiled:
            self._begin(iteration + 1)
        return len(self.ran) + len(self.ran_regional) != ran

    def _warn(self, why: str) -> None:
        chosen = " and ".join(str(i) for i in self.iterations)
        how = ("compiled with each of its repeated blocks a compiled region of its own, marked around (meta.json: "
               "regional_iterations)" if self._regional is not None else
               "eagerly (torch.compiler.set_stance('force_eager'); meta.json: eager_iterations)")
        warnings.warn(
            f"{why}: compiled graphs run no module hooks, so memprof runs iteration(s) {chosen} {how} for per-layer "
            "costs and the planner's chain; the other iterations keep exact totals and categories, without "
            "per-layer rows, and only they headline the report", RuntimeWarning, stacklevel=5)

    def _begin(self, iteration: int) -> None:
        if iteration not in self.iterations or self._stance is not None:
            return
        if self._regional is not None:
            self._regional.install()
            self._stance, self._current = self._regional, iteration
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

    def close(self) -> None:
        """Ends the current costing iteration and drops the blocks' compiled code (at the profiler's ``close()``)."""
        self.end()
        if self._regional is not None:
            self._regional.close()

    def end(self) -> None:
        """Gives the compiler back the stance it had (idempotent; also called at ``close()``)."""
        if self._stance is None:
            return
        if self._stance is self._regional:
            assert self._regional is not None
            if self._current == self.iterations[-1]:  # the last one: dynamo meets its frames afresh
                self._regional.close()
            else:
                self._regional.remove()
            done = self.ran_regional
        else:
            self._stance.__exit__(None, None, None)
            done = self.ran
        self._stance = None
        if self._current is not None:
            done.append(self._current)
        self._current = None
