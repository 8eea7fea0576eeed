"""Per-rank peaks of a distributed run and their imbalance."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from memprof import TraceNotFoundError, load_trace
from memprof.trace.ranks import peak_imbalance, rank_dirs, rank_of, rank_peaks
from tests.dashboard.fixtures import write_profiled_run


def _two_ranks(root):
    for rank in (0, 1):
        write_profiled_run(root / "ddp" / f"rank={rank}", "ddp", iterations=3, scale=1 + 2 * rank, rank=rank,
                           world_size=2)
    (root / "ddp" / "notes").mkdir()  # not a rank: ignored
    return root / "ddp"


def test_rank_peaks_reads_every_rank(tmp_path):
    run = _two_ranks(tmp_path)
    assert [r for r, _ in rank_dirs(run)] == [0, 1]
    assert (rank_of(run / "rank=12"), rank_of(run / "notes"), rank_of(run / "rank=x")) == (12, None, None)
    peaks = rank_peaks(run)
    assert list(peaks.columns) == ["rank", "iteration", "peak_allocated_bytes", "peak_reserved_bytes"]
    for rank in (0, 1):
        own = load_trace(run / f"rank={rank}").iterations.sort_values("iteration")
        mine = peaks[peaks["rank"] == rank]
        assert mine["iteration"].tolist() == own["iteration"].tolist()
        assert mine["peak_allocated_bytes"].tolist() == own["peak_allocated_bytes"].tolist()
    imbalance = peak_imbalance(peaks)
    by_rank = peaks.groupby("rank")["peak_allocated_bytes"].max()
    assert imbalance.highest_rank == 1 and imbalance.lowest_rank == 0
    assert imbalance.ratio == pytest.approx(by_rank[1] / by_rank[0]) and imbalance.ratio > 1
    assert imbalance.spread_bytes == by_rank[1] - by_rank[0]


def test_imbalance_by_hand():
    frame = pd.DataFrame({"rank": [0, 0, 1, 2], "iteration": [0, 1, 0, 0],
                          "peak_allocated_bytes": [90, 100, 150, 150], "peak_reserved_bytes": [0, 0, 0, 0]})
    imbalance = peak_imbalance(frame)
    assert imbalance.peak_by_rank_bytes == {0: 100, 1: 150, 2: 150}
    assert (imbalance.highest_rank, imbalance.lowest_rank) == (1, 0)  # ties go to the lowest rank
    assert imbalance.ratio == 1.5 and imbalance.spread_bytes == 50
    zero = peak_imbalance(frame.assign(peak_allocated_bytes=[0, 0, 5, 5]))
    assert math.isinf(zero.ratio)
    assert peak_imbalance(frame.iloc[:0]) is None


def test_a_run_without_ranks_is_refused(tmp_path):
    write_profiled_run(tmp_path / "single", "single")
    with pytest.raises(TraceNotFoundError, match="rank=<r>"):
        rank_peaks(tmp_path / "single")
    with pytest.raises(TraceNotFoundError):
        rank_peaks(tmp_path / "missing")
