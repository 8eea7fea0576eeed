"""Profiling ``lightning.Trainer``: one callback.

Usage::

    from memprof.integrations.lightning import MemprofCallback

    trainer = lightning.Trainer(max_epochs=3, callbacks=[MemprofCallback(out_dir="traces")])
    trainer.fit(lit_module, train_loader)

Needs ``lightning`` (``pip install 'memprof[lightning]'``); the standalone ``pytorch_lightning``
package has a Callback class of its own, which this is not.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("memprof.integrations.lightning needs lightning: pip install 'memprof[lightning]'") from exc

import torch
from torch import nn

from memprof.capture.profiler import MemoryProfiler, _is_memory_error
from memprof.errors import ProfilerError
from memprof.integrations.probe import ForwardProbe, RootChoice, choose_root
from memprof.integrations.runs import refuse_existing_run
from memprof.units import format_bytes

__all__ = ["MemprofCallback"]


class MemprofCallback(pl.Callback):
    """Profiles a ``lightning.Trainer``'s training with a :class:`memprof.MemoryProfiler`.

    The profiled module is the one whose forward the training step runs. A ``LightningModule``'s
    ``training_step`` often calls ``self.model(x)`` and never the LightningModule's own ``forward``;
    profiled as the root, its forward would never be seen to begin (feature maps read as ``other``).
    So the first optimizer step is a probe (:mod:`memprof.integrations.probe`): light hooks note which
    modules the step calls, and the profiler then attaches to the LightningModule if its own forward
    ran, else to the one submodule the step called. ``meta.json`` names it (``profiled_module``, its
    qualified name in the LightningModule, ``""`` for the LightningModule itself, and
    ``profiled_module_reason``); a warning says so when no single module's forward covers the step.
    Pass ``module=`` to skip the probe (profiling then starts with the first step).

    The optimizer is the Trainer's (``trainer.optimizers[0]``; Lightning's ``optimizer.step(closure)``
    runs forward and backward inside the step, which memprof's hooks see: the optimizer phase begins
    when the closure returns). One recorded iteration is one optimizer step: with
    ``accumulate_grad_batches=k``, its k batches. Validation run during training falls into the
    iteration in which it runs.

    Args:
        out_dir: folder for traces (``out_dir/<run_id>``).
        module: the module to profile, as its qualified name in the LightningModule (``""``: the
            LightningModule itself, ``"model"``: ``lit_module.model``); ``None``: found by the probe.
        **profiler_kwargs: passed to :class:`memprof.MemoryProfiler` (``run_id``, ``print_period``,
            ``extra_meta``, ...).

    Attributes:
        profiler: the live profiler while training, else ``None``.
        run_dir: the last run's directory (``None`` before profiling started).
        choice: which module was profiled and why (``None`` before it is known).
    """

    def __init__(self, out_dir: str | Path = "traces", module: str | None = None, **profiler_kwargs: Any) -> None:
        if "model" in profiler_kwargs or "optimizer" in profiler_kwargs:
            raise ProfilerError("MemprofCallback takes the model and optimizer from the Trainer; pass neither "
                                "(module='<name>' chooses the submodule to profile)")
        if module is not None and not isinstance(module, str):
            raise ProfilerError(f"module must be a qualified module name such as 'model' (or '' for the "
                                f"LightningModule itself), found {type(module).__name__}")
        self.out_dir = out_dir
        self.module = module
        self.profiler_kwargs = profiler_kwargs
        self.profiler: MemoryProfiler | None = None
        self.run_dir: Path | None = None
        self.choice: RootChoice | None = None
        self._probe: ForwardProbe | None = None
        self._last_step = 0

    # ------------------------------------------------------------------ Lightning's hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Refuses a ``run_id`` whose folder holds a trace already, before any training (the profiler itself starts
        after the first optimizer step).

        Raises:
            RunExistsError: ``out_dir/run_id`` already holds a trace.
        """
        if stage == "fit":
            refuse_existing_run(self.out_dir, self.profiler_kwargs)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Starts the probe (or, given ``module``, the profiler)."""
        self.close()  # a second fit() starts a new run
        self._last_step = trainer.global_step
        if self.module is None:
            self._probe = ForwardProbe(pl_module)
            return
        try:
            chosen = pl_module.get_submodule(self.module)
        except AttributeError as exc:
            raise ProfilerError(f"MemprofCallback(module={self.module!r}): {type(pl_module).__name__} has no such "
                                f"submodule ({exc}); name one of its modules, e.g. 'model', or '' for itself") from exc
        self._start(trainer, pl_module, RootChoice(self.module, chosen, "chosen with module=", True))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each optimizer step: ends the probe, or records the iteration."""
        if trainer.global_step <= self._last_step:
            return  # a batch of an accumulation that has not stepped yet
        self._last_step = trainer.global_step
        if self._probe is not None:
            probe, self._probe = self._probe, None
            probe.remove()
            self._start(trainer, pl_module, choose_root(pl_module, probe.outermost))
        elif self.profiler is not None:
            self.profiler.record_stats()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Numbers later iterations with the next epoch."""
        if self.profiler is not None:
            self.profiler.epoch_end()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Closes the run."""
        if self._probe is not None:
            warnings.warn("MemprofCallback recorded nothing: training ended within the first optimizer step, "
                          "which it spends finding the module to profile (pass module=... to skip that)",
                          RuntimeWarning, stacklevel=2)
        self.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Writes a post-mortem of an out-of-memory error, and closes the run."""
        if self.profiler is not None and _is_memory_error(exception):
            self.profiler.record_failure(exception)
        self.close()

    # ------------------------------------------------------------------ the run
    def close(self) -> None:
        """Removes the probe and closes the live profiler, if any (idempotent)."""
        if self._probe is not None:
            self._probe.remove()
            self._probe = None
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.close()

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, choice: RootChoice) -> None:
        self.choice = choice
        kind = type(pl_module).__name__
        if not choice.certain:
            warnings.warn(f"memprof profiles {kind} itself, but {choice.reason}: its forward phase and feature maps "
                          f"cannot be told apart (they read as 'other'). Call the model from {kind}.forward "
                          "(self(x) in training_step), or pass MemprofCallback(module='<name>')", RuntimeWarning,
                          stacklevel=3)
        _warn_outside(pl_module, choice)
        meta = {"integration": "lightning", "lightning_module": kind, "profiled_module": choice.name,
                "profiled_module_reason": choice.reason, **(self.profiler_kwargs.get("extra_meta") or {})}
        options = {**self.profiler_kwargs, "extra_meta": meta}
        self.profiler = MemoryProfiler(choice.module, _optimizer(trainer), out_dir=self.out_dir, **options)
        self.run_dir = self.profiler.run_dir


def _optimizer(trainer: pl.Trainer) -> torch.optim.Optimizer | None:
    optimizers = list(trainer.optimizers)
    if len(optimizers) > 1:
        warnings.warn(f"the Trainer has {len(optimizers)} optimizers; memprof hooks the first only: the others' "
                      "steps read as 'other' and their state is not attributed", RuntimeWarning, stacklevel=4)
    return optimizers[0] if optimizers else None


def _warn_outside(pl_module: nn.Module, choice: RootChoice) -> None:
    """Warns when the LightningModule trains parameters that the profiled module does not hold."""
    inside = {id(p) for p in choice.module.parameters()}
    outside = [p for p in pl_module.parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        nbytes = sum(p.numel() * p.element_size() for p in outside)
        warnings.warn(f"{len(outside)} trained parameters ({format_bytes(nbytes)}) of {type(pl_module).__name__} lie "
                      f"outside the profiled module '{choice.name}': their weights are not counted and their "
                      "gradients read as 'other'", RuntimeWarning, stacklevel=4)
