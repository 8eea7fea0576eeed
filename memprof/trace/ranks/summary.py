"""The ranks of a distributed run side by side: each rank's peaks and how unevenly memory is spread.

Under ``torchrun`` every rank writes ``<run>/rank=<r>/`` (see :mod:`memprof.schema`). A rank that
peaks higher than the others sets the memory every GPU must have, so the imbalance of peaks is what a
user of DDP or FSDP looks at first: uneven batches, a rank holding extra state, or sharding skew.

A 64-rank run of 100,000 iterations has 6.4 million ``iterations`` rows: :func:`scan_ranks` reads them
as one Parquet dataset in one streaming pass (:mod:`memprof.trace.ranks.scan`) and keeps, per rank,
a summary row and a few thousand plotting points, never the rows themselves.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from memprof.errors import TraceNotFoundError
from memprof.trace.damage import PartDamage, damage_message
from memprof.trace.ranks.scan import RankResult, aggregate_ranks

_RANK_DIR = re.compile(r"^rank=(\d+)$")
PEAK_COLUMNS = ("iteration", "peak_allocated_bytes", "peak_reserved_bytes")


def rank_of(directory: str | Path) -> int | None:
    """The rank a ``rank=<r>`` folder holds, or ``None`` for any other folder name."""
    found = _RANK_DIR.match(Path(directory).name)
    return int(found.group(1)) if found else None


def rank_dirs(run_root: str | Path) -> list[tuple[int, Path]]:
    """``(rank, directory)`` of every ``rank=<r>`` folder under a distributed run, by rank."""
    root = Path(run_root)
    if not root.is_dir():
        return []
    return sorted((rank, p) for p in root.iterdir() if p.is_dir() and (rank := rank_of(p)) is not None)


#: Points per rank that :func:`rank_peaks` keeps by default: enough for a plot, few for 64 ranks.
DEFAULT_MAX_POINTS = 2_000
#: Columns of :attr:`RankScan.summary`.
SUMMARY_COLUMNS = ("rank", "peak_allocated_bytes", "peak_iteration", "peak_module", "peak_phase", "iterations",
                   "peak_reserved_bytes")


@dataclass(frozen=True)
class RankScan:
    """What one pass over every rank of a distributed run found.

    Attributes:
        summary: one row per rank with at least one iteration, by rank: ``rank``, its highest
            ``peak_allocated_bytes``, the ``peak_iteration`` where it happened (the first on ties), the
            ``peak_module`` and ``peak_phase`` at that peak, its count of distinct ``iterations`` and its
            highest ``peak_reserved_bytes``.
        peaks: each rank's peaks over iterations, at most ``max_points`` rows per rank: ``rank``,
            ``iteration``, ``peak_allocated_bytes``, ``peak_reserved_bytes``. A rank's span of
            iterations is cut into equal buckets; each row is a bucket's highest peak at the iteration
            it happened and the bucket's highest reserved bytes, so no peak is lost.
        ranks: every rank found, with or without iterations.
        max_points: the limit of points per rank (``None``: every iteration).
        damage: the damaged ``iterations`` parts left out (their names relative to the run's folder, so
            ``rank=<r>/...``), with the iterations each cost; empty for a sound run.
    """

    summary: pd.DataFrame
    peaks: pd.DataFrame
    ranks: tuple[int, ...]
    max_points: int | None
    damage: tuple[PartDamage, ...] = ()

    @property
    def damage_message(self) -> str | None:
        """:attr:`damage` in one line (the reader's words: :func:`memprof.trace.damage.damage_message`), or ``None``."""
        return damage_message(self.damage)

    @property
    def nbytes(self) -> int:
        """Bytes the two frames hold (what a cache of scans counts)."""
        return int(sum(f.memory_usage(index=True, deep=True).sum() for f in (self.summary, self.peaks)))


def scan_ranks(run_root: str | Path, max_points: int | None = DEFAULT_MAX_POINTS, *,
               strict: bool = False) -> RankScan:
    """Reads every rank's ``iterations`` as one dataset, streaming: the summary and the decimated peaks.

    Memory is bounded by a block of rows of one rank (:data:`memprof.trace.ranks.scan.FOLD_ROWS`) plus,
    per rank, a summary row and ``max_points`` buckets; the ranks are never loaded whole. Iterations
    still in a rank's journal (a killed or running rank) are included, as :func:`memprof.load_trace` shows them.
    A damaged part (unreadable footer, pages failing their checksums) is left out, as ``load_trace`` leaves it
    out: its rank loses the iterations it held, :attr:`RankScan.damage` lists it, and one ``RuntimeWarning``
    names every such part.

    Args:
        run_root: the run's folder holding ``rank=<r>`` folders.
        max_points: most peaks kept per rank (at least 1); ``None`` keeps one per iteration.
        strict: refuse a rank with a damaged part (``RankTraceError``) instead of leaving the part out.

    Raises:
        ValueError: ``max_points`` is below 1.
        TraceNotFoundError: ``run_root`` holds no ``rank=<r>`` folder.
        RankTraceError: a rank's trace is unreadable, or (``strict``) has a damaged part (the error's ``rank``
            and message name it).
        CorruptTraceError: parts kept vanishing during every attempt (a compaction rewriting the run).
    """
    if max_points is not None and max_points < 1:
        raise ValueError(f"max_points must be at least 1 (or None for every iteration), found {max_points}")
    found = rank_dirs(run_root)
    if not found:
        raise TraceNotFoundError(f"{run_root} holds no rank=<r> folders; expected a run written under torchrun")
    results, damage = aggregate_ranks(Path(run_root), found, max_points, strict)
    scanned = RankScan(_summary(results), _peaks(results), tuple(rank for rank, _ in found), max_points, damage)
    if damage:
        warnings.warn(f"run {Path(run_root).name}: {scanned.damage_message}", RuntimeWarning, stacklevel=2)
    return scanned


def rank_summary(run_root: str | Path, *, strict: bool = False) -> pd.DataFrame:
    """Each rank's highest peak, where it happened and its iteration count (see :attr:`RankScan.summary`).

    A damaged part is left out with a warning, or (``strict``) refused, as :func:`scan_ranks` says.
    """
    return scan_ranks(run_root, max_points=1, strict=strict).summary


def rank_peaks(run_root: str | Path, max_points: int | None = DEFAULT_MAX_POINTS, *,
               strict: bool = False) -> pd.DataFrame:
    """Each rank's peaks over iterations, at most ``max_points`` per rank (see :attr:`RankScan.peaks`).

    A damaged part is left out with a warning, or (``strict``) refused, as :func:`scan_ranks` says.

    Raises:
        TraceNotFoundError: ``run_root`` holds no ``rank=<r>`` folder.
        RankTraceError: a rank's trace is unreadable, or (``strict``) has a damaged part (the message names it).
    """
    return scan_ranks(run_root, max_points, strict=strict).peaks


def _summary(results: list[RankResult]) -> pd.DataFrame:
    rows = [{"rank": r.aggregate.rank, "peak_allocated_bytes": r.aggregate.peak_allocated_bytes,
             "peak_iteration": r.aggregate.peak_iteration, "peak_module": r.peak_module, "peak_phase": r.peak_phase,
             "iterations": r.aggregate.iterations, "peak_reserved_bytes": r.aggregate.peak_reserved_bytes}
            for r in results if r.aggregate.intervals]
    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return frame.astype({c: "int64" for c in SUMMARY_COLUMNS if c not in ("peak_module", "peak_phase")})


def _peaks(results: list[RankResult]) -> pd.DataFrame:
    frames = [pd.DataFrame({c: pd.Series(dtype="int64") for c in ("rank", *PEAK_COLUMNS)})]
    for result in results:
        aggregate = result.aggregate
        kept = aggregate.bucket_peak >= 0  # buckets without an iteration stay at -1
        frames.append(pd.DataFrame({"rank": np.full(int(kept.sum()), aggregate.rank, np.int64),
                                    "iteration": aggregate.bucket_iteration[kept],
                                    "peak_allocated_bytes": aggregate.bucket_peak[kept],
                                    "peak_reserved_bytes": aggregate.bucket_reserved[kept]}))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class RankImbalance:
    """How unevenly the ranks' peaks are spread (each rank's peak is its highest over the iterations).

    Attributes:
        peak_by_rank_bytes: rank -> its peak allocated bytes.
        highest_rank: the rank with the highest peak (the lowest rank on ties).
        lowest_rank: the rank with the lowest peak.
        ratio: highest peak over lowest peak (1.0 when balanced; ``inf`` when the lowest is 0).
        spread_bytes: highest peak minus lowest peak.
    """

    peak_by_rank_bytes: dict[int, int]
    highest_rank: int
    lowest_rank: int
    ratio: float
    spread_bytes: int


def peak_imbalance(peaks: pd.DataFrame) -> RankImbalance | None:
    """The imbalance of a :func:`rank_summary` or :func:`rank_peaks` frame; ``None`` when it has no rows.

    Any frame with ``rank`` and ``peak_allocated_bytes`` columns will do: each rank's peak is its highest row.
    """
    if peaks.empty:
        return None
    by_rank = peaks.groupby("rank", sort=True)["peak_allocated_bytes"].max()
    values = {int(rank): int(value) for rank, value in by_rank.items()}
    highest = max(values, key=lambda r: (values[r], -r))
    lowest = min(values, key=lambda r: (values[r], r))
    top, bottom = values[highest], values[lowest]
    ratio = top / bottom if bottom else (1.0 if top == 0 else float("inf"))
    return RankImbalance(values, highest, lowest, ratio, top - bottom)
