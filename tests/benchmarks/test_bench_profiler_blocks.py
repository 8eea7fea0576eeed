"""The in-process block benchmark's report: block ratios against the same block's baseline, the call's mean."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_profiler_blocks as bb
from memprof.capture.native.build import NativeBuildError, load


def test_each_block_is_compared_with_the_baseline_of_the_same_block() -> None:
    # the second block ran on a slower machine: 10% more per block against its own baseline, whatever the level
    means = {"baseline": [10.0, 20.0, 30.0], "memprof": [11.0, 22.0, 33.0]}
    trains = {"baseline": [10.0, 20.0, 30.0], "memprof": [10.5, 21.0, 31.5]}
    calls = {"baseline": [0.01] * 3, "memprof": [0.5] * 9 + [10.5]}  # one call waited 10 ms for the worker
    base, line = bb.report(["baseline", "memprof"], means, trains, calls)
    assert base == "baseline: mean step 20.00 ms (median of blocks), train_step 20.00 ms"
    assert line.startswith("memprof: 1.100x (quartiles 1.100-1.100), mean step 22.00 ms, train_step 21.00 ms")
    assert line.endswith("call median 0.50 ms, mean 1.50 ms")


def test_the_reporter_alone_records_and_leaves_no_reporter_behind(tmp_path) -> None:
    try:
        load()
    except NativeBuildError as exc:  # (no compiler here: memprof falls back to torch.profiler)
        pytest.skip(f"no native reporter: {exc}")
    tool = bb.ReporterOnly()
    tool.start(torch.nn.Linear(2, 2), None, tmp_path)  # type: ignore[arg-type]
    torch.ones(1000).sum()
    assert tool._stream is not None and len(tool._stream.collect().size_bytes) > 0
    assert torch.autograd._profiler_enabled()  # (the reporter holds the profiler's slot while it records)
    tool.stop()
    tool.stop()  # (twice: nothing left to stop)
    assert tool._stream is None and not torch.autograd._profiler_enabled()
    assert {tool.name for tool in bb.CONTROLS} == {"baseline 2", "reporter only"}
