"""memprof: an exact, per-layer PyTorch memory profiler that writes Parquet traces."""

from memprof.categories import CATEGORY_COLUMNS, Category
from memprof.errors import (
    CorruptTraceError,
    MemoryBudgetExceeded,
    MemprofError,
    ProfilerError,
    SchemaVersionError,
    TraceError,
    TraceNotFoundError,
)
from memprof.profiler import MemoryProfiler
from memprof.reader import RunEntry, Trace, list_runs, load_trace
from memprof.units import format_bytes, parse_bytes

__all__ = [
    "CATEGORY_COLUMNS",
    "Category",
    "CorruptTraceError",
    "MemoryBudgetExceeded",
    "MemoryProfiler",
    "MemprofError",
    "ProfilerError",
    "RunEntry",
    "SchemaVersionError",
    "Trace",
    "TraceError",
    "TraceNotFoundError",
    "format_bytes",
    "list_runs",
    "load_trace",
    "parse_bytes",
]
