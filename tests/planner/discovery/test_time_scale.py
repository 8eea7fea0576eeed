"""The chain's stage times are the layers' recorded times scaled to the step without the profiler's hooks."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from examples import zoo
from memprof import load_trace
from memprof.analysis.phase_times import META_KEY, PhaseTime
from planner import chain_from_trace
from planner.discovery.time_scale import NO_SCALE, TimeScale, time_scale_from
from tests.memprof.helpers import profile_steps


def _time(iteration: int, steady: bool, forward: float, backward: float, host_forward: float = 0.0,
          host_backward: float = 0.0) -> PhaseTime:
    return PhaseTime(iteration=iteration, steady=steady, host_forward_ms=host_forward or forward,
                     host_backward_ms=host_backward or backward, forward_ms=forward, backward_ms=backward)


def test_the_steady_iterations_median_over_the_costed_ones_is_the_scale() -> None:
    times = [_time(1, False, 9.0, 9.0, host_forward=8.0, host_backward=4.0),
             _time(2, False, 9.0, 9.0, host_forward=10.0, host_backward=6.0),
             _time(3, False, 1.0, 1.0, host_forward=100.0, host_backward=100.0),  # hooked, but not costed
             _time(4, True, 2.0, 3.0), _time(5, True, 3.0, 4.0), _time(6, True, 9.0, 9.0)]
    scale = time_scale_from(times, costed=[1, 2], clock="cuda")
    assert scale == TimeScale(forward=3.0 / 9.0, backward=4.0 / 5.0, basis="steady", clock="cuda", iterations=3)


def test_without_steady_iterations_the_costed_ones_device_clock_is_the_basis() -> None:
    times = [_time(1, False, 6.0, 8.0, host_forward=12.0, host_backward=4.0)]
    assert time_scale_from(times, costed=[1], clock="cuda") == \
        TimeScale(forward=0.5, backward=2.0, basis="hooked", clock="cuda", iterations=1)
    on_a_cpu = [_time(1, False, 6.0, 8.0)]  # the host's clock is the device's: nothing to scale
    assert time_scale_from(on_a_cpu, costed=[1]) == TimeScale(basis="hooked", iterations=1)


def test_no_costed_iteration_timed_or_a_zero_time_leaves_the_times_as_recorded() -> None:
    assert time_scale_from([_time(4, True, 2.0, 3.0)], costed=[1, 2]) is NO_SCALE
    assert time_scale_from([], costed=[1]) is NO_SCALE
    assert time_scale_from([_time(1, False, 0.0, 3.0), _time(4, True, 2.0, 3.0)], costed=[1]) is NO_SCALE
    with pytest.raises(ValueError, match="forward"):
        TimeScale(forward=0.0)
    with pytest.raises(ValueError, match="basis"):
        TimeScale(basis="guess")


def test_a_run_that_went_steady_scales_every_stage_and_the_loss_by_its_phase_times(tmp_path) -> None:
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=4, width=128)
    trace = profile_steps(model, make_batch, tmp_path / "run", steps=14, batch_size=64, background=False)
    scaled = chain_from_trace(trace)
    # the same run without its phase times: the layers' times as recorded
    shutil.copytree(trace.path, tmp_path / "bare")
    meta = json.loads((tmp_path / "bare" / "meta.json").read_text())
    del meta[META_KEY]
    (tmp_path / "bare" / "meta.json").write_text(json.dumps(meta))
    recorded = chain_from_trace(load_trace(tmp_path / "bare"))
    scale = scaled.source["time_scale"]
    assert scale["basis"] == "steady" and scale["iterations"] >= 2
    assert recorded.source["time_scale"]["basis"] == "none"
    assert len(scaled.stages) == len(recorded.stages)
    for ours, theirs in zip(scaled.stages, recorded.stages):
        assert ours.forward_ms == pytest.approx(theirs.forward_ms * scale["forward"], rel=1e-3)
        assert ours.backward_ms == pytest.approx(theirs.backward_ms * scale["backward"], rel=1e-3)
        assert (ours.saved_bytes, ours.output_bytes) == (theirs.saved_bytes, theirs.output_bytes)
    assert scaled.stages[-1].name == "loss" and scaled.stages[-1].forward_ms > 0


def test_a_scale_reads_back_from_the_chains_source_and_says_what_it_did() -> None:
    scale = TimeScale(forward=0.4812, backward=0.93, basis="steady", clock="cuda", iterations=4)
    assert TimeScale.from_json(scale.to_json()) == scale
    assert scale.describe() == "layer times scaled to 4 steady iterations (hooks off): forward x0.48, backward x0.93"
    hooked = TimeScale(forward=0.7, backward=1.2, basis="hooked", clock="cuda", iterations=2)
    assert hooked.describe() == "layer times scaled to the device's clock (cuda): forward x0.70, backward x1.20"
    assert TimeScale.from_json(None) is NO_SCALE and NO_SCALE.describe() == "layer times as recorded"
