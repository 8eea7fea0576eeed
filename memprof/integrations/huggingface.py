"""Profiling the Hugging Face ``Trainer``: one callback.

Usage::

    from memprof.integrations.huggingface import MemprofCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MemprofCallback(out_dir="traces")])
    trainer.train()

Needs ``transformers`` and ``accelerate`` (``pip install 'memprof[huggingface]'``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "memprof.integrations.huggingface needs transformers and accelerate: pip install 'memprof[huggingface]'"
    ) from exc

from memprof.capture.profiler import MemoryProfiler
from memprof.errors import ProfilerError
from memprof.integrations.runs import refuse_existing_run

__all__ = ["MemprofCallback"]


class MemprofCallback(TrainerCallback):
    """Profiles a ``transformers.Trainer``'s training with a :class:`memprof.MemoryProfiler`.

    At train begin it attaches a profiler to the trainer's model (``trainer.model``, the unwrapped
    model) and its optimizer (accelerate's ``AcceleratedOptimizer``, unwrapped to the
    ``torch.optim.Optimizer`` inside); it records an iteration at the end of every optimizer step,
    ends an epoch with the trainer's, and closes the run at train end. The batch the Trainer passes
    by keyword (``model(input_ids=..., labels=...)``) is the ``inputs`` category.

    One recorded iteration is one optimizer step: with ``gradient_accumulation_steps=k`` it holds the
    k micro-batches' forwards and backwards (and the batches the Trainer fetched for them, all alive
    at once), gradient clipping, the optimizer step and ``zero_grad``. Logging, evaluation and
    checkpointing that the Trainer runs after a step fall into the next iteration, before its
    forward; evaluate outside the profiled run (``eval_strategy="no"``) for clean steps.

    Every process of a distributed run profiles its own rank (one trace per rank). A training run
    that raises does not reach train end: call :meth:`close` then (``record_failure`` on the
    :attr:`profiler` first for a post-mortem of an out-of-memory error).

    Args:
        out_dir: folder for traces (``out_dir/<run_id>``).
        **profiler_kwargs: passed to :class:`memprof.MemoryProfiler` (``run_id``, ``print_period``,
            ``extra_meta``, ``detail_first``, ``ops``, ...). ``meta.json`` also gets
            ``integration: "huggingface"`` and ``gradient_accumulation_steps``.

    Attributes:
        profiler: the live profiler between train begin and train end, else ``None``.
        run_dir: the last run's directory (``None`` before training).
    """

    def __init__(self, out_dir: str | Path = "traces", **profiler_kwargs: Any) -> None:
        if "model" in profiler_kwargs or "optimizer" in profiler_kwargs:
            raise ProfilerError("MemprofCallback takes the model and optimizer from the Trainer; "
                                "pass neither (only MemoryProfiler's keyword arguments)")
        self.out_dir = out_dir
        self.profiler_kwargs = profiler_kwargs
        self.profiler: MemoryProfiler | None = None
        self.run_dir: Path | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        """Attaches the profiler to the Trainer's model and optimizer, before the first step.

        Raises:
            RunExistsError: a ``run_id`` given to the callback names a run folder that holds a trace already.
        """
        if model is None:
            raise ProfilerError("the Trainer passed MemprofCallback no model at train begin; "
                                "create the Trainer with model=... (model_init is called before train begin)")
        self.close()  # a second trainer.train() starts a new run
        refuse_existing_run(self.out_dir, self.profiler_kwargs)  # the same one line as Lightning's callback
        meta = {"integration": "huggingface", "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
                **(self.profiler_kwargs.get("extra_meta") or {})}  # the user's keys win
        options = {**self.profiler_kwargs, "extra_meta": meta}
        self.profiler = MemoryProfiler(model, optimizer, out_dir=self.out_dir, **options)
        self.run_dir = self.profiler.run_dir

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """Ends the iteration: one optimizer step (all its micro-batches) and its ``zero_grad``."""
        if self.profiler is not None:
            self.profiler.record_stats()

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Numbers later iterations with the next epoch."""
        if self.profiler is not None:
            self.profiler.epoch_end()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Closes the run: hooks removed, ``meta.json`` final."""
        if self.profiler is not None and self.profiler.iteration == 0:
            warnings.warn("MemprofCallback recorded no iteration: the Trainer ran no optimizer step",
                          RuntimeWarning, stacklevel=2)
        self.close()

    def close(self) -> None:
        """Closes the live profiler, if any (idempotent; for a training run that raised)."""
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.close()
