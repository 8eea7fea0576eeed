"""Planner data for the dashboard: containers, model state, measured memory, measured vs predicted.

A chain found in a run carries step costs, so budgets, predictions and measurements are the whole step's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import planner
from dashboard.measured import (
    MEASURED_COLUMNS,
    compare_measured,
    measured_activation,
    measured_runs,
    measured_step,
    same_schedule,
)
from dashboard.planning import container_choices, model_state_bytes, planner_model
from memprof import load_trace
from memprof.categories import MODEL_STATE
from planner.model.step import StepCosts
from tests.dashboard.fixtures import (
    INPUT_BYTES,
    STEP_COSTS,
    STEP_NS,
    TRANSIENT_BYTES,
    WEIGHTS_BYTES,
    activation_profile,
    measured_expectations,
    measured_step_expectations,
    write_measured_run,
)


def test_container_choices_are_modules_with_two_children(store):
    assert container_choices(store.model_layers("mlp")) == ["features"]
    assert container_choices(store.model_layers("mlp").iloc[0:0]) == []


def test_model_state_bytes_at_the_peak(store):
    # At the peak (backward) the run holds weights and their gradients, no optimizer state yet.
    assert model_state_bytes(store.iterations("mlp")) == 2 * WEIGHTS_BYTES
    assert {c.value for c in MODEL_STATE} == {"weights", "buffers", "weight_grads", "optimizer_state", "comm_buffers"}


def test_measured_activation_removes_model_state_and_starts_at_forward(store):
    frame = measured_activation(store.timeline("mlp-measured", 0))
    profile = [p for p in activation_profile(1) if p[0] in ("forward", "backward")]
    assert tuple(frame.columns) == MEASURED_COLUMNS
    assert frame["memory_bytes"].tolist() == [p[3] for p in profile]
    assert (frame["peak_bytes"] - frame["memory_bytes"]).eq(TRANSIENT_BYTES).all()
    assert frame["time_ms"].iloc[0] == 0.0  # the "other start" row before forward is not counted
    assert np.allclose(np.diff(frame["time_ms"]), STEP_NS / 1e6)
    assert frame["memory_bytes"].iloc[0] == INPUT_BYTES


def test_measured_step_is_what_the_allocator_held(store):
    frame = measured_step(store.timeline("mlp-measured", 0))
    _, allocated, times = measured_step_expectations()
    assert tuple(frame.columns) == MEASURED_COLUMNS
    assert frame["memory_bytes"].tolist() == allocated  # nothing taken away: weights, batch, optimizer state
    assert (frame["peak_bytes"] - frame["memory_bytes"]).eq(TRANSIENT_BYTES).all()
    assert frame["time_ms"].tolist() == pytest.approx(times) and frame["time_ms"].iloc[0] == 0.0
    # the optimizer step is part of the whole step (weights, their gradients, the optimizer's state, the batch)
    assert frame["memory_bytes"].iloc[-1] == 3 * WEIGHTS_BYTES + INPUT_BYTES


def test_measured_activation_of_no_forward_is_empty():
    frame = pd.DataFrame({"time_ms": [0.0], "phase": ["other"], "allocated_bytes": [5], "peak_bytes": [5],
                          **{c.value: [0] for c in MODEL_STATE}})
    assert measured_activation(frame).empty and measured_step(frame).empty
    assert tuple(measured_step(frame).columns) == MEASURED_COLUMNS


def test_measured_runs_link_to_their_source(store):
    assert measured_runs(store, "mlp") == ["mlp-measured"]
    assert measured_runs(store, "ddp") == []


def test_planner_model_is_one_cached_solve(store, monkeypatch):
    model = planner_model(store, "mlp", None)
    chain = planner.chain_from_trace(load_trace(store.path("mlp")))
    front = planner.pareto_front(chain)
    assert model.whole_step and model.step == chain.step is not None
    assert model.min_budget_bytes == front.min_feasible_bytes == planner.min_feasible_budget(chain)
    assert model.max_budget_bytes == planner.store_all_budget(chain)  # the whole step's store-all peak
    assert model.max_budget_bytes == front.max_budget_bytes
    assert model.chain.fingerprint() == chain.fingerprint()
    assert set(model.points["algorithm"]) >= {"store_all", "rotor"}
    monkeypatch.setattr(planner, "pareto_front", lambda *a, **k: pytest.fail("solved again"))
    assert planner_model(store, "mlp", None) is model
    assert model.clamp(None) == (model.min_budget_bytes + model.max_budget_bytes) // 2
    assert model.clamp(-5) == model.min_budget_bytes and model.clamp(1e30) == model.max_budget_bytes


def test_planner_model_of_a_named_container(store):
    model = planner_model(store, "mlp", "features")
    assert model.chain.length == 5
    with pytest.raises(planner.NotAChainError):
        planner_model(store, "mlp", "features.0")


def test_compare_measured_whole_step_against_the_simulator(store):
    run = compare_measured(store, "mlp-measured")
    comparison = run.comparison
    schedule = planner.Schedule.from_json(store.meta("mlp-measured")["schedule"])
    prediction = planner.simulate(schedule.chain, schedule)
    step = StepCosts(**STEP_COSTS)
    predicted = step.step_peak_bytes(prediction.peak_bytes)
    peak, allocated, _ = measured_step_expectations()
    _, span_ms = measured_expectations()
    assert run.whole_step and (run.base_bytes, run.floor_bytes) == (step.base_bytes, step.floor_bytes)
    # the same quantity on both sides: the whole step's peak, predicted and as the allocator saw it
    assert comparison.predicted_peak_bytes == predicted == schedule.predicted_step_peak_bytes
    assert comparison.predicted_chain_peak_bytes == prediction.peak_bytes
    assert comparison.measured_peak_bytes == peak == store.iterations("mlp-measured")["peak_allocated_bytes"].max()
    assert run.measured["memory_bytes"].tolist() == allocated
    assert comparison.predicted_makespan_ms == pytest.approx(prediction.makespan_ms)
    assert comparison.measured_step_ms == pytest.approx(span_ms)
    assert comparison.peak_error == pytest.approx(peak / predicted - 1)
    assert comparison.time_error == pytest.approx(span_ms / prediction.makespan_ms - 1)
    assert same_schedule(run.schedule, schedule)


def test_compare_measured_chain_only_schedule_in_activations(store, traces):
    write_measured_run(traces.root / "mlp-chain-only", "mlp-chain-only", source_run="mlp", step=False)
    run = compare_measured(store, "mlp-chain-only")
    comparison = run.comparison
    schedule = planner.Schedule.from_json(store.meta("mlp-chain-only")["schedule"])
    prediction = planner.simulate(schedule.chain, schedule)
    peak, _ = measured_expectations()
    assert not run.whole_step and run.base_bytes is None and run.floor_bytes is None
    assert comparison.predicted_peak_bytes == comparison.predicted_chain_peak_bytes == prediction.peak_bytes
    assert comparison.measured_peak_bytes == peak  # allocated minus model state
    assert comparison.peak_error == pytest.approx(peak / prediction.peak_bytes - 1)


def test_prediction_frame_matches_the_simulators_table(store):
    from dashboard.planning import prediction_frame

    model = planner_model(store, "mlp", None)
    prediction = planner.simulate(model.chain, model.front.schedule_at(model.min_budget_bytes))
    expected = prediction.to_frame().drop(columns=["live"])
    pd.testing.assert_frame_equal(prediction_frame(prediction), expected, check_dtype=False)
