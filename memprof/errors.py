"""Exceptions raised by the profiler and the trace reader.

Every message says what was expected and what was found, so that a user can fix the input.
"""

from __future__ import annotations


class MemprofError(Exception):
    """Base class of every error this project raises on purpose."""


class TraceError(MemprofError):
    """A trace directory cannot be read."""


class TraceNotFoundError(TraceError, FileNotFoundError):
    """The run directory, or a file it must contain, does not exist."""


class CorruptTraceError(TraceError):
    """A trace file exists but is not a readable memprof file (truncated, foreign or damaged)."""


class SchemaVersionError(TraceError):
    """The trace was written with a schema version this reader does not know."""


class RankTraceError(TraceError):
    """One rank of a distributed run cannot be read; the message names the rank and why.

    Attributes:
        rank: the rank whose ``rank=<r>`` folder is unreadable.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # keeps ``rank`` through pickling (worker pools)
        return type(self), (str(self), self.rank)


class ProfilerError(MemprofError):
    """The profiler was used in a way it cannot support (e.g. attached twice to one model)."""


class RunExistsError(ProfilerError, FileExistsError):
    """The run folder a profiler would write (its ``out_dir/run_id``) already holds a trace; nothing was written.

    Raised before any training by ``MemoryProfiler`` and by the trainers' callbacks at fit or train start: a
    fixed ``run_id`` reused names a run that is there already (leave ``run_id`` out for a new one each run).
    """


class MemoryBudgetExceeded(MemprofError, RuntimeError):
    """Allocated memory crossed the profiler's ``budget_bytes`` guard."""


class SnapshotFormatError(MemprofError):
    """A file is not a PyTorch CUDA memory snapshot memprof can read (not a pickle, a foreign or unsafe
    pickle, or a dict that lacks what ``torch.cuda.memory._dump_snapshot`` writes); the message says which."""


class OutputExistsError(MemprofError, FileExistsError):
    """The output a command would write already exists; nothing was changed (pass ``force`` to replace it)."""


class EstimateError(MemprofError):
    """A training step cannot be estimated on fake tensors (an op needs real values, or bad arguments).

    Attributes:
        op: the operator that could not run on fake tensors (e.g. ``aten.nonzero.default``), or ``None``
            when the arguments were the problem.
    """

    def __init__(self, message: str, op: str | None = None) -> None:
        super().__init__(message)
        self.op = op

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:  # keeps ``op`` through pickling
        return type(self), (str(self), self.op)
