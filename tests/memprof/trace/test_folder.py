"""``load_trace`` on a torchrun job's folder: the rank whose peak is highest by default, any rank on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprof import load_trace
from memprof.errors import TraceNotFoundError
from memprof.trace.folder import rank_to_open
from tests.dashboard.fixtures import write_profiled_run


def _job(root: Path, scales: tuple[int, ...]) -> Path:
    job = root / "job"
    for rank, scale in enumerate(scales):
        write_profiled_run(job / f"rank={rank}", f"ddp-{rank}", iterations=3, scale=scale, rank=rank,
                           world_size=len(scales))
    return job


@pytest.mark.parametrize("scales, highest", [((1, 3), 1), ((4, 1, 2), 0)])
def test_a_jobs_folder_opens_its_highest_rank(tmp_path: Path, scales: tuple[int, ...], highest: int) -> None:
    job = _job(tmp_path, scales)
    peaks = {r: int(load_trace(job / f"rank={r}").iterations.peak_allocated_bytes.max()) for r in range(len(scales))}
    assert max(peaks, key=peaks.__getitem__) == highest  # the oracle: each rank opened on its own
    trace = load_trace(job)
    assert trace.meta["rank"] == highest and trace.path == job / f"rank={highest}"
    assert rank_to_open(job) == (highest, job / f"rank={highest}")


def test_any_rank_on_request_and_a_missing_one_says_which_there_are(tmp_path: Path) -> None:
    job = _job(tmp_path, (1, 3))
    assert load_trace(job, rank=0).meta["rank"] == 0
    with pytest.raises(TraceNotFoundError, match=r"has no rank 4: it holds ranks \[0, 1\]"):
        load_trace(job, rank=4)


def test_a_single_run_opens_as_before_and_refuses_another_rank(tmp_path: Path) -> None:
    job = _job(tmp_path, (1, 3))
    assert load_trace(job / "rank=1").meta["rank"] == 1
    assert load_trace(job / "rank=1", rank=1).meta["rank"] == 1
    with pytest.raises(TraceNotFoundError, match="is one run, of rank 1, not 0"):
        load_trace(job / "rank=1", rank=0)


def test_a_job_whose_ranks_have_no_iteration_yet_opens_its_lowest(tmp_path: Path) -> None:
    job = _job(tmp_path, (1, 3))
    for rank in (0, 1):  # a job that just started: meta.json written, no part yet
        for table in (job / f"rank={rank}").iterdir():
            if table.is_dir():
                for part in table.iterdir():
                    part.unlink()
    assert rank_to_open(job) == (0, job / "rank=0")
