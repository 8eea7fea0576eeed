"""The trace on disk: its contract, the journal between processes, writing, and reading.

:mod:`~memprof.schema` is the contract; :mod:`~memprof.trace.journal` carries raw records to
:mod:`~memprof.trace.worker`, which writes Parquet parts through :mod:`~memprof.trace.writer`;
:mod:`~memprof.trace.reader` (with :mod:`~memprof.trace.recovery` for a killed run and
:mod:`~memprof.trace.ranks` for distributed runs) is the one way everything else reads a trace.
The worker's modules import neither torch nor pandas; the reader uses pandas.

Public names load on first use: the reader's need pandas, which the worker never imports.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.schema import (
        EVENTS,
        ITERATIONS,
        LAYERS,
        META_FILE,
        SCHEMA_VERSION,
        TABLES,
        table_dir_name,
    )
    from memprof.trace.ranks import (
        RankScan,
        peak_imbalance,
        rank_dirs,
        rank_of,
        rank_peaks,
        rank_summary,
        scan_ranks,
    )
    from memprof.trace.reader import RunEntry, Trace, list_runs, load_trace
    from memprof.trace.writer import TraceWriter

_LAZY = {
    "EVENTS": "memprof.schema",
    "ITERATIONS": "memprof.schema",
    "LAYERS": "memprof.schema",
    "META_FILE": "memprof.schema",
    "RankScan": "memprof.trace.ranks",
    "RunEntry": "memprof.trace.reader",
    "SCHEMA_VERSION": "memprof.schema",
    "TABLES": "memprof.schema",
    "Trace": "memprof.trace.reader",
    "TraceWriter": "memprof.trace.writer",
    "list_runs": "memprof.trace.reader",
    "load_trace": "memprof.trace.reader",
    "peak_imbalance": "memprof.trace.ranks",
    "rank_dirs": "memprof.trace.ranks",
    "rank_of": "memprof.trace.ranks",
    "rank_peaks": "memprof.trace.ranks",
    "rank_summary": "memprof.trace.ranks",
    "scan_ranks": "memprof.trace.ranks",
    "table_dir_name": "memprof.schema",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EVENTS",
    "ITERATIONS",
    "LAYERS",
    "META_FILE",
    "RankScan",
    "RunEntry",
    "SCHEMA_VERSION",
    "TABLES",
    "Trace",
    "TraceWriter",
    "list_runs",
    "load_trace",
    "peak_imbalance",
    "rank_dirs",
    "rank_of",
    "rank_peaks",
    "rank_summary",
    "scan_ranks",
    "table_dir_name",
]
