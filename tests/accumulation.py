"""Gradient accumulation in the tests: k micro-batches per optimizer step, ``record_stats()`` once per step.

The model is the tests' Hugging Face GPT-2 (``tests/planner/real_models.py``) without dropout: every
micro-batch then allocates the same bytes, so a run's layers can be compared with a single-forward run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import torch

from memprof import MemoryProfiler
from tests.planner.real_models import RealModel, gpt2

MICRO_BATCHES = 4
BATCH = 2  # per micro-batch
SEQ = 32  # tokens per sequence (real_models' language-model batches)


def gpt2_without_dropout() -> RealModel:
    """GPT-2 of ``GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=512, n_positions=64, use_cache=False,
    attn_implementation="eager", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)``, seeded."""
    return gpt2(dropout=0.0)


def accumulation_step(real: RealModel, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      batches: Sequence[tuple] | Callable[[], tuple], micro_batches: int = MICRO_BATCHES,
                      set_to_none: bool = True) -> None:
    """One optimizer step over ``micro_batches`` forward/backward pairs, each loss divided by their number.

    Args:
        batches: the micro-batches, or a function making each one when its turn comes (as a data loader: one
            micro-batch alive at a time).
    """
    optimizer.zero_grad(set_to_none=set_to_none)
    for index in range(micro_batches):
        batch = batches() if callable(batches) else batches[index]
        (real.loss(model, batch) / micro_batches).backward()
        del batch
    optimizer.step()


def profile_accumulation(real: RealModel, out_dir: Path, micro_batches: int, steps: int = 3,
                         set_to_none: bool = True, batches: Sequence[tuple] | None = None,
                         stream: IO[str] | None = None, background: bool = False) -> tuple[Path, torch.optim.Optimizer]:
    """Profiles ``steps`` optimizer steps of ``micro_batches`` micro-batches each; returns the run and optimizer.

    Args:
        batches: the micro-batches every step uses (default: fresh ones made one at a time).
        stream: where the console report goes (default: none is printed).
    """
    model = real.model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=1 if stream is not None else 0,
                        stream=stream, background=background) as profiler:
        for _ in range(steps):
            accumulation_step(real, model, optimizer, batches if batches is not None else _fresh(real),
                              micro_batches, set_to_none)
            profiler.record_stats()
    return profiler.run_dir, optimizer


def _fresh(real: RealModel) -> Callable[[], tuple]:
    return lambda: real.make_batch(BATCH)
