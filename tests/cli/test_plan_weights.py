"""``memprof plan --stream-weights``: streamed stages in the schedule, the step peak they leave, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from memprof import load_trace
from memprof.units import format_bytes
from planner import chain_from_trace
from planner.model.schedule import Schedule
from planner.model.weights import streamed_step
from planner.simulation.simulator import simulate
from planner.solvers.dispatch import min_feasible_budget
from tests.cli.helpers import EXAMPLE_RUN, TOY, one_line_error


def test_plan_streams_weights_at_a_budget_only_streaming_reaches(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    chain = chain_from_trace(load_trace(EXAMPLE_RUN))
    assert chain.weights is not None and sum(chain.weights.param_bytes) > 0
    least = min_feasible_budget(chain, "rotor", stream_weights=True)
    assert least < min_feasible_budget(chain, "rotor")
    out = tmp_path / "schedule.json"
    assert main(["plan", str(EXAMPLE_RUN), "--budget", str(least), "--stream-weights", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    streamed = list(schedule.streamed_weights)
    assert streamed and schedule.chain.weights == chain.weights
    step = streamed_step(schedule.chain, streamed)
    assert step is not None
    assert schedule.predicted_step_peak_bytes == step.step_peak_bytes(schedule.predicted_peak_bytes) <= least
    assert schedule.predicted_host_peak_bytes == simulate(schedule.chain, schedule).host_peak_bytes > 0
    text = capsys.readouterr().out
    assert f"streamed weights {len(streamed)} stages {streamed} live in host memory" in text
    assert f"step peak        {format_bytes(schedule.predicted_step_peak_bytes)} predicted for the whole step" in text


def test_plan_stream_weights_on_a_chain_without_weight_costs_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(TOY), "--budget", "90MiB", "--stream-weights", "--out", str(out)]) == 2
    assert "no weight costs" in one_line_error(capsys)
    assert not out.exists()
