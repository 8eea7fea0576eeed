"""The ranks of a distributed run: one streaming scan over every rank's trace and the queries on it.

:mod:`~memprof.trace.ranks.summary` holds the queries (each rank's peaks, the imbalance between
ranks), :mod:`~memprof.trace.ranks.plan` what the pass reads of each rank (its parts' footers, its journal),
:mod:`~memprof.trace.ranks.scan` the single pass over the ranks' ``iterations`` parts,
:mod:`~memprof.trace.ranks.aggregate` the per-rank accumulator it feeds, and
:mod:`~memprof.trace.ranks.damaged` the damaged parts it leaves out.
"""

from memprof.trace.ranks.summary import (
    DEFAULT_MAX_POINTS,
    PEAK_COLUMNS,
    SUMMARY_COLUMNS,
    RankImbalance,
    RankScan,
    peak_imbalance,
    rank_dirs,
    rank_of,
    rank_peaks,
    rank_summary,
    scan_ranks,
)

__all__ = [
    "DEFAULT_MAX_POINTS",
    "PEAK_COLUMNS",
    "SUMMARY_COLUMNS",
    "RankImbalance",
    "RankScan",
    "peak_imbalance",
    "rank_dirs",
    "rank_of",
    "rank_peaks",
    "rank_summary",
    "scan_ranks",
]
