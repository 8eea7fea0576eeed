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


def test_a_blocks_train_step_is_its_steps_less_the_per_iteration_calls() -> None:
    lane = bb.Lane(bb.MODELS[0], 1, bb.Tool(), None, None, None)  # type: ignore[arg-type]  # nothing is trained
    lane.wall_ms = [[10.0, 12.0], [20.0, 30.0]]  # two blocks of two steps, each step with its call
    lane.call_ms = [1.0, 1.0, 0.5, 9.5]  # the last call waited for the worker
    means, trains = bb.block_figures(lane, steps=2)
    assert means == [11.0, 25.0] and trains == [10.0, 20.0]


def test_an_unknown_tool_is_refused_naming_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        bb.main(["--tools", "memprof,nope"])
    error = capsys.readouterr().err
    assert "--tools: unknown ['nope']" in error and "'reporter only'" in error and "'memprof (inline)'" in error
