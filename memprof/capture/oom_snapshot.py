"""``MemoryProfiler(..., snapshot_on_oom=True)``: PyTorch's allocation history, dumped when a step runs out of memory.

On CUDA the recorder turns on ``torch.cuda.memory._record_memory_history`` (Python stacks, at most
``max_entries`` entries kept, the newest; an earlier recording's entries cleared, so the snapshot is this run's)
when the profiler opens, unless it is on already; when the profiler
records an out-of-memory failure it writes ``torch.cuda.memory._dump_snapshot`` to
``<run_dir>/oom_snapshot.pickle`` beside the post-mortem; at close it turns recording off again if it turned it
on (recording someone else started is left as it was). ``memprof import-snapshot`` reads the file, and so does
PyTorch's ``memory_viz``. Elsewhere than CUDA it warns once and does nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from memprof.atomic import atomic_path

#: File name of the snapshot in the run directory.
SNAPSHOT_FILE = "oom_snapshot.pickle"
#: Entries of allocation history kept by default (the newest; a few KB each with their stacks).
DEFAULT_MAX_ENTRIES = 100_000
NEEDS_CUDA = ("snapshot_on_oom=True needs a CUDA device: PyTorch records allocation history only for its CUDA "
              "caching allocator; the profiler runs without it")


def _history_enabled() -> bool:
    """Whether CUDA allocation history is being recorded now (``False`` where torch cannot say)."""
    query = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(query()) if query is not None else False


class OomSnapshot:
    """Records CUDA allocation history for one profiler and dumps it on an out-of-memory failure.

    Args:
        device: the profiled model's device.
        max_entries: history entries kept (the newest).
        memory: the module with ``_record_memory_history`` and ``_dump_snapshot`` (``torch.cuda.memory``;
            tests pass a stand-in).
    """

    def __init__(self, device: torch.device, max_entries: int = DEFAULT_MAX_ENTRIES,
                 memory: ModuleType | Any | None = None) -> None:
        self.active = device.type == "cuda"
        self.max_entries = max_entries
        self.memory: Any = memory if memory is not None else (torch.cuda.memory if self.active else None)
        self.started = False  # this recorder turned recording on (and turns it off at stop)
        self.path: Path | None = None
        if not self.active:
            warnings.warn(NEEDS_CUDA, RuntimeWarning, stacklevel=3)

    def start(self) -> None:
        """Turns history recording on unless it already is."""
        if not self.active or _history_enabled():
            return
        options = {"enabled": "all", "context": "all", "stacks": "python", "max_entries": self.max_entries}
        try:  # PyTorch keeps the entries of an earlier recording unless told: the snapshot is this run's only
            self.memory._record_memory_history(**options, clear_history=True)
        except TypeError:  # a torch without clear_history (before 2.5)
            self.memory._record_memory_history(**options)
        self.started = True

    def dump(self, run_dir: Path) -> Path | None:
        """Writes the snapshot to ``run_dir/oom_snapshot.pickle`` (atomically); returns its path.

        A failure to write is a warning, not an error: the post-mortem and the user's exception come first.
        """
        if not self.active or self.path is not None:
            return self.path
        target = Path(run_dir) / SNAPSHOT_FILE
        try:
            with atomic_path(target) as temporary:
                self.memory._dump_snapshot(str(temporary))
        except Exception as exc:  # the snapshot must never hide the out-of-memory error being handled
            warnings.warn(f"memprof could not write the allocation snapshot {target}: {exc}", RuntimeWarning,
                          stacklevel=3)
            return None
        self.path = target
        return target

    def stop(self) -> None:
        """Turns recording off if :meth:`start` turned it on. Idempotent."""
        if self.started:
            self.started = False
            self.memory._record_memory_history(enabled=None)
