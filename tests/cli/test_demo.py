"""``memprof demo``: summary lines in the whole step's memory; what it needs is checked before it profiles."""

from __future__ import annotations

import socket
import sys

import pytest

import cli.demo
from cli.demo import measured_line
from cli.main import main
from planner import Comparison
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.step import StepCosts
from tests.cli.helpers import exit_code, one_line_error

MIB = 2**20


def _schedule(step: StepCosts | None) -> Schedule:
    chain = Chain("h", MIB, (Stage(1.0, 2.0, MIB, MIB, MIB), Stage(0.0, 0.0, 0, 0, 0)), step=step)
    ops = (Op(OpKind.F_ALL, 1), Op(OpKind.F_ALL, 2), Op(OpKind.B, 2), Op(OpKind.B, 1))
    return Schedule("rotor", 300 * MIB, ops, chain)


def test_measured_line_in_whole_step_memory():
    step = StepCosts(model_state_bytes=200 * MIB, inputs_bytes=MIB, outside_bytes=0, before_peak_bytes=201 * MIB,
                     after_peak_bytes=250 * MIB)
    cmp = Comparison(predicted_chain_peak_bytes=40 * MIB, measured_activation_peak_bytes=42 * MIB,
                     predicted_makespan_ms=3.0,
                     measured_step_ms=3.3, predicted_step_peak_bytes=250 * MIB, measured_step_peak_bytes=255 * MIB)
    assert measured_line(_schedule(step), cmp) == (
        "  rotor at budget 300.0 MiB: predicted step peak 250.0 MiB, measured 255.0 MiB (+2.0%); "
        "time predicted 3.0 ms, measured 3.3 ms")


def test_measured_line_of_a_chain_only_schedule():
    cmp = Comparison(predicted_chain_peak_bytes=40 * MIB, measured_activation_peak_bytes=42 * MIB,
                     predicted_makespan_ms=3.0,
                     measured_step_ms=3.3)
    assert measured_line(_schedule(None), cmp).startswith(
        "  rotor at budget 300.0 MiB: predicted activation peak 40.0 MiB, measured 42.0 MiB (+5.0%); ")


def _never_profile(monkeypatch) -> None:
    monkeypatch.setattr(cli.demo, "profile_model", lambda *a, **k: pytest.fail("profiled"))


def test_without_the_dashboard_extra_it_stops_before_profiling(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "dash", None)
    _never_profile(monkeypatch)
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert one_line_error(capsys) == ("memprof demo: error: the dashboard needs the dashboard extra: "
                                      "pip install 'memprof[dashboard]'")


def test_a_taken_port_stops_it_before_profiling(monkeypatch, tmp_path, capsys):
    _never_profile(monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--out", str(tmp_path), "--port", str(port)]) == 2
    one_line_error(capsys, f"memprof demo: error: cannot serve on 127.0.0.1:{port}:")


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--port", "99999"], "argument --port: must be a whole number between 1 and 65535, found '99999'"),
    (["--port", "web"], "argument --port: must be a whole number between 1 and 65535"),
    (["--iterations", "0"], "argument --iterations: must be a whole number >= 1, found '0'"),
])
def test_bad_options_are_one_line(monkeypatch, tmp_path, capsys, argv, fragment):
    _never_profile(monkeypatch)
    assert exit_code(["demo", "--out", str(tmp_path), *argv]) == 2
    one_line_error(capsys, "memprof demo: error:", fragment)


def test_the_long_chain_section_is_binomials_optimal_count():
    from planner.solvers.binomial_split import forward_count

    lines = cli.demo.long_chain_lines(length=300, snapshots=5)
    assert lines[0].startswith("long chain: 300 stages of 1.0 MiB; binomial checkpointing with 5 snapshots in ")
    count = forward_count(301, 5)
    assert lines[1].startswith(f"  {count} forward evaluations (optimal for 301 steps and 5 snapshots: {count});")


@pytest.mark.slow
def test_the_estimate_of_a_demo_model_matches_its_profiled_peak(tmp_path):
    # the demo's first section: each model estimated on fake tensors before it runs, then measured
    spec = cli.demo.DEMO_MODELS[1]  # the GPT-style stack
    found = cli.demo.estimate_model(spec, tmp_path, "t")
    run_dir = cli.demo.profile_model(spec, tmp_path, "t", iterations=2)
    line = cli.demo.estimate_line(spec, found, run_dir)
    assert line.startswith(f"gpt: estimated step peak {cli.demo.format_bytes(found.peak_bytes)} before running")
    error = float(line.rsplit("(", 1)[1].rstrip("%)"))
    assert abs(error) <= 3.0, line
