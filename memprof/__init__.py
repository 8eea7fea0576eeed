"""memprof: an exact, per-layer PyTorch memory profiler that writes Parquet traces."""

from typing import TYPE_CHECKING, Any

from memprof.categories import CATEGORY_COLUMNS, Category
from memprof.errors import (
    CorruptTraceError,
    EstimateError,
    MemoryBudgetExceeded,
    MemprofError,
    OutputExistsError,
    ProfilerError,
    RankTraceError,
    RunExistsError,
    SchemaVersionError,
    SnapshotFormatError,
    TraceError,
    TraceNotFoundError,
)
from memprof.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from memprof.capture.profiler import MemoryProfiler
    from memprof.estimation.run import Estimate, estimate
    from memprof.trace.folder import load_trace
    from memprof.trace.reader import RunEntry, Trace, list_runs

# Imported on first use: the profiler imports torch and the reader pandas, and the background worker
# (``python -m memprof.trace.pipeline.worker``, which runs this file first) needs neither.
_LAZY = {"MemoryProfiler": "memprof.capture.profiler", "RunEntry": "memprof.trace.reader", "Trace": "memprof.trace.reader",
         "list_runs": "memprof.trace.reader", "load_trace": "memprof.trace.folder",
         "Estimate": "memprof.estimation.run", "estimate": "memprof.estimation.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprof' has no attribute {name!r}")


__all__ = [
    "CATEGORY_COLUMNS",
    "Category",
    "CorruptTraceError",
    "Estimate",
    "EstimateError",
    "MemoryBudgetExceeded",
    "MemoryProfiler",
    "MemprofError",
    "OutputExistsError",
    "ProfilerError",
    "RankTraceError",
    "RunEntry",
    "RunExistsError",
    "SchemaVersionError",
    "SnapshotFormatError",
    "Trace",
    "TraceError",
    "TraceNotFoundError",
    "estimate",
    "format_bytes",
    "list_runs",
    "load_trace",
    "parse_bytes",
]
