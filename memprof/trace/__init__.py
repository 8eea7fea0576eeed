"""The trace on disk, in three parts and a reader: the format, the pipeline, the ranks.

:mod:`~memprof.schema` is the contract. :mod:`~memprof.trace.format` writes it (atomic Parquet
parts, their compaction, the ops table); :mod:`~memprof.trace.pipeline` moves raw records from the
training process to the trace (the journal, the background worker, the recovery of a killed run's
journal); :mod:`~memprof.trace.reader` is the one way everything else reads a trace, and
:mod:`~memprof.trace.ranks` scans the ranks of a distributed run. The format's and the pipeline's
modules import neither torch nor pandas; the reader uses pandas.

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
    from memprof.trace.folder import job_ranks, load_trace, rank_to_open
    from memprof.trace.format.writer import TraceWriter
    from memprof.trace.ranks import (
        RankScan,
        peak_imbalance,
        rank_dirs,
        rank_of,
        rank_peaks,
        rank_summary,
        scan_ranks,
    )
    from memprof.trace.reader import RunEntry, Trace, list_runs

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
    "TraceWriter": "memprof.trace.format.writer",
    "job_ranks": "memprof.trace.folder",
    "list_runs": "memprof.trace.reader",
    "load_trace": "memprof.trace.folder",
    "peak_imbalance": "memprof.trace.ranks",
    "rank_dirs": "memprof.trace.ranks",
    "rank_of": "memprof.trace.ranks",
    "rank_peaks": "memprof.trace.ranks",
    "rank_summary": "memprof.trace.ranks",
    "rank_to_open": "memprof.trace.folder",
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
    "job_ranks",
    "list_runs",
    "load_trace",
    "peak_imbalance",
    "rank_dirs",
    "rank_of",
    "rank_peaks",
    "rank_summary",
    "rank_to_open",
    "scan_ranks",
    "table_dir_name",
]
