"""The ranks of a distributed run side by side: each rank's peaks and how unevenly memory is spread.

Under ``torchrun`` every rank writes ``<run>/rank=<r>/`` (see :mod:`memprof.trace.schema`). A rank that
peaks higher than the others sets the memory every GPU must have, so the imbalance of peaks is what a
user of DDP or FSDP looks at first: uneven batches, a rank holding extra state, or sharding skew.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from memprof.errors import TraceNotFoundError
from memprof.trace.reader import load_trace
from memprof.trace.schema import ITERATIONS

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


def rank_peaks(run_root: str | Path) -> pd.DataFrame:
    """Every rank's iterations: ``rank``, ``iteration``, ``peak_allocated_bytes``, ``peak_reserved_bytes``.

    Raises:
        TraceNotFoundError: ``run_root`` holds no ``rank=<r>`` folder.
        TraceError: a rank's trace is unreadable (the message names it).
    """
    found = rank_dirs(run_root)
    if not found:
        raise TraceNotFoundError(f"{run_root} holds no rank=<r> folders; expected a run written under torchrun")
    frames = []
    for rank, directory in found:
        table = load_trace(directory).read(ITERATIONS, columns=list(PEAK_COLUMNS))
        frames.append(table.assign(rank=rank))
    frame = pd.concat(frames, ignore_index=True)
    return frame[["rank", *PEAK_COLUMNS]].sort_values(["rank", "iteration"], kind="stable").reset_index(drop=True)


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
    """The imbalance of a :func:`rank_peaks` frame; ``None`` when it has no iterations."""
    if peaks.empty:
        return None
    by_rank = peaks.groupby("rank", sort=True)["peak_allocated_bytes"].max()
    values = {int(rank): int(value) for rank, value in by_rank.items()}
    highest = max(values, key=lambda r: (values[r], -r))
    lowest = min(values, key=lambda r: (values[r], r))
    top, bottom = values[highest], values[lowest]
    ratio = top / bottom if bottom else (1.0 if top == 0 else float("inf"))
    return RankImbalance(values, highest, lowest, ratio, top - bottom)
