"""``memprof demo``'s summary lines speak the whole step's memory when the chain has step costs."""

from __future__ import annotations

from dashboard.demo import measured_line
from planner import Comparison
from planner.chain import Chain, Stage
from planner.schedule import Op, OpKind, Schedule
from planner.step import StepCosts

MIB = 2**20


def _schedule(step: StepCosts | None) -> Schedule:
    chain = Chain("h", MIB, (Stage(1.0, 2.0, MIB, MIB, MIB), Stage(0.0, 0.0, 0, 0, 0)), step=step)
    ops = (Op(OpKind.F_ALL, 1), Op(OpKind.F_ALL, 2), Op(OpKind.B, 2), Op(OpKind.B, 1))
    return Schedule("rotor", 300 * MIB, ops, chain)


def test_measured_line_in_whole_step_memory():
    step = StepCosts(model_state_bytes=200 * MIB, inputs_bytes=MIB, outside_bytes=0, before_peak_bytes=201 * MIB,
                     after_peak_bytes=250 * MIB)
    cmp = Comparison(predicted_chain_peak_bytes=40 * MIB, measured_activation_peak_bytes=42 * MIB,
                     predicted_makespan_ms=3.0, measured_step_ms=3.3, predicted_step_peak_bytes=250 * MIB, measured_step_peak_bytes=255 * MIB)
    assert measured_line(_schedule(step), cmp) == (
        "  rotor at budget 300.0 MiB: predicted step peak 250.0 MiB, measured 255.0 MiB (+2.0%); "
        "time predicted 3.0 ms, measured 3.3 ms")


def test_measured_line_of_a_chain_only_schedule():
    cmp = Comparison(predicted_chain_peak_bytes=40 * MIB, measured_activation_peak_bytes=42 * MIB,
                     predicted_makespan_ms=3.0, measured_step_ms=3.3)
    assert measured_line(_schedule(None), cmp).startswith(
        "  rotor at budget 300.0 MiB: predicted activation peak 40.0 MiB, measured 42.0 MiB (+5.0%); ")
