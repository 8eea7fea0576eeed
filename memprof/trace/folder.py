"""Opening a run folder: one run's, or a torchrun job's, whose ranks each wrote a ``rank=<r>`` folder.

A job's ranks are separate runs of one model (:class:`memprof.MemoryProfiler` writes each rank's trace in its
own folder). Asked for the job, the reader opens one rank: the one asked for, else the one whose peak is
highest, since every rank needs the memory the highest one needs (the ranks' scan finds it from the parts'
rows of ``iterations`` alone, :mod:`memprof.trace.ranks`).
"""

from __future__ import annotations

from pathlib import Path

from memprof.errors import TraceNotFoundError
from memprof.schema import META_FILE
from memprof.trace.parts import PartCache
from memprof.trace.ranks import peak_imbalance, rank_dirs, rank_summary
from memprof.trace.reader import Trace, load_run, read_meta

__all__ = ["job_ranks", "load_trace", "rank_to_open"]


def job_ranks(run_dir: str | Path) -> dict[int, Path]:
    """The ``rank=<r>`` directories of a torchrun job's folder, by rank (``{}``: a single run, or no run)."""
    run_dir = Path(run_dir)
    return dict(rank_dirs(run_dir)) if not (run_dir / META_FILE).is_file() else {}


def rank_to_open(run_dir: str | Path, rank: int | None = None) -> tuple[int | None, Path]:
    """Which run directory :func:`load_trace` opens for ``run_dir``, and its rank (``None``: not a job's folder).

    Args:
        run_dir: a run directory, or a torchrun job's folder of ``rank=<r>`` directories.
        rank: the rank to open in a job's folder; ``None``: the one whose peak is highest (the lowest rank while
            none has recorded an iteration). A single run directory is opened if its ``meta.json`` agrees.

    Raises:
        TraceNotFoundError: ``rank`` is not one of the job's, or a single run's ``meta.json`` says another rank.
    """
    run_dir = Path(run_dir)
    ranks = job_ranks(run_dir)
    if not ranks:
        if rank is not None and (found := read_meta(run_dir).get("rank")) != rank:
            raise TraceNotFoundError(f"{run_dir} is one run, of rank {found}, not {rank}: give a torchrun job's folder "
                                     "(rank=<r> folders) to choose a rank, or leave the rank out")
        return rank, run_dir
    if rank is not None:
        if rank not in ranks:
            raise TraceNotFoundError(f"{run_dir} has no rank {rank}: it holds ranks {sorted(ranks)} "
                                     f"({', '.join(f'rank={r}' for r in sorted(ranks))})")
        return rank, ranks[rank]
    imbalance = peak_imbalance(rank_summary(run_dir))
    chosen = imbalance.highest_rank if imbalance is not None else min(ranks)
    return chosen, ranks[chosen]


def load_trace(run_dir: str | Path, *, rank: int | None = None, strict: bool = False,
               cache: PartCache | None = None) -> Trace:
    """Opens a run directory written by :class:`memprof.MemoryProfiler`, or one rank of a torchrun job's folder.

    Metadata and every Parquet footer are validated now; table data is read on first access
    (:func:`memprof.trace.reader.load_run`, which says what a damaged part costs). ``trace.meta["rank"]`` says
    which rank was opened.

    Args:
        run_dir: the run directory, or a job's folder of ``rank=<r>`` directories.
        rank: in a job's folder, the rank to open; ``None``: the rank whose peak is highest.
        strict: raise :class:`memprof.errors.CorruptTraceError` at the first damaged part instead of skipping it.
        cache: where footer checks and part reads are kept (see :func:`memprof.trace.reader.load_run`).

    Raises:
        TraceNotFoundError: the directory or its metadata is missing, or the job has no such rank.
        CorruptTraceError: the metadata is damaged or written by another tool (or, ``strict``, any part is).
        SchemaVersionError: the trace's schema version is unknown to this reader.
        RankTraceError: choosing the highest rank, a rank's trace could not be scanned.
    """
    _, directory = rank_to_open(run_dir, rank)
    return load_run(directory, strict=strict, cache=cache)
