"""A trainer callback's run folder, checked before training starts.

``MemoryProfiler`` refuses a run folder that already holds a trace (:class:`memprof.errors.RunExistsError`), but a
callback creates its profiler late: Lightning's after the first optimizer step (the probe), so a reused ``run_id``
failed with a traceback after a step of training. The callbacks call :func:`refuse_existing_run` when fitting or
training starts instead, so the same error comes first, in one line, before any training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memprof.errors import RunExistsError

__all__ = ["refuse_existing_run"]


def _rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def refuse_existing_run(out_dir: str | Path, profiler_kwargs: dict[str, Any]) -> None:
    """Raises where the profiler's run folder (this rank's, when distributed) already holds a trace.

    Args:
        out_dir: the callback's folder for traces.
        profiler_kwargs: the keyword arguments the callback passes to ``MemoryProfiler``; only a ``run_id`` given
            there can name a folder that exists (the default is new for every run).

    Raises:
        RunExistsError: ``out_dir/run_id`` (``/rank=<r>`` in a distributed run, as the profiler writes it) holds a
            ``meta.json``.
    """
    run_id = profiler_kwargs.get("run_id")
    if not run_id:
        return
    rank, world_size = _rank()
    folder = Path(out_dir) / str(run_id)
    folder = folder / f"rank={rank}" if world_size > 1 else folder
    if (folder / "meta.json").exists():
        raise RunExistsError(f"run folder {folder} already holds a trace (run_id={run_id!r}); pass another run_id, "
                             "leave run_id out (each run then gets a new one), or remove the folder")
