"""The dashboard on a real profiled model and a real measured schedule (not synthetic tables)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

import planner
from dashboard import callbacks as cb
from dashboard import callbacks_planner as cp
from dashboard.data import TraceStore
from examples import zoo
from memprof import load_trace
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes
from planner.measure.runs import measure_schedule
from tests.dashboard.fixtures import profile_mlp


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A profiled MLP (run ``mlp``) and one measured schedule of it (run ``mlp-rotor``)."""
    root = tmp_path_factory.mktemp("real") / "traces"
    make_batch, _ = profile_mlp(root)
    store = TraceStore(root)
    low, high = cp.planner_bounds(store, ["mlp"], cp.AUTO)[:2]
    chain = planner.chain_from_trace(load_trace(root / "mlp"))
    schedule = planner.pareto_front(chain).schedule_at((low + high) // 2)
    measured_model, _ = zoo.mlp(blocks=3, width=64, in_features=32)
    _, comparison = measure_schedule(measured_model, make_batch, schedule, root, steps=3, batch_size=256,
                                     run_id="mlp-rotor", source_run="mlp")
    return TraceStore(root), chain, schedule, comparison


def test_runs_and_overview(real):
    store, *_ = real
    rows, selected, empty, _ = cb.runs_view(store)
    assert [r["name"] for r in rows] == ["mlp", "mlp-rotor"] and all(not r["error"] for r in rows)
    assert rows[selected[0]]["name"] == "mlp"
    text, peaks, _ = cb.overview_view(store, ["mlp"])
    assert text.startswith("Peak ")
    assert list(peaks.data[0].y) == store.iterations("mlp")["peak_allocated_bytes"].tolist()


def test_layers_and_timeline(real):
    store, *_ = real
    rows, tree = cb.layers_view(store, ["mlp"], 2, "weight_bytes")
    # The root and its 7 children (4 Linear, 3 ReLU); a Linear's weight is in*out*4 + out*4 bytes.
    assert len(rows) == 8
    assert rows[1]["weight_bytes"] == 32 * 64 * 4 + 64 * 4
    fig, _ = cb.timeline_view(store, ["mlp"], 2)
    frame = store.timeline("mlp", 2)
    stacked = sum(np.asarray(t.y) for t in fig.data if t.name in CATEGORY_COLUMNS)
    assert stacked.tolist() == frame["allocated_bytes"].tolist()


def test_planner_and_measured_schedule(real):
    store, chain, schedule, comparison = real
    front = planner.pareto_front(chain)
    low, high = cp.planner_bounds(store, ["mlp"], cp.AUTO)[:2]
    assert (low, high) == (front.min_feasible_bytes, front.max_budget_bytes)
    budget = (low + high) // 2
    _, peak_text, makespan_text, ops_text, planned, _, _ = cp.planner_view(store, ["mlp"], cp.AUTO, budget)
    assert ops_text == " ".join(str(op) for op in schedule.ops)
    # The measured run executed exactly this schedule, so it is drawn over the prediction.
    assert "; measured " in peak_text and "; measured " in makespan_text
    # whole-step memory: the simulator's chain timeline plus what the step holds beside the chain
    base = format_bytes(chain.step.base_bytes)
    memory = [t for t in go.Figure(planned).data if t.yaxis == "y2"]  # the row under the schedule
    assert [t.name for t in memory] == [f"predicted (chain + {base} beside it)", "measured (mlp-rotor)"]
    blocks = cp.measured_view(store, ["mlp"])
    sentence = blocks[0].children[0].children
    # the dashboard compares the same quantities as measure_schedule: the whole step's peak, both sides
    assert cp.compare_measured(store, "mlp-rotor").comparison == comparison
    assert comparison.predicted_step_peak_bytes == schedule.predicted_step_peak_bytes is not None
    expected = comparison.measured_step_peak_bytes / comparison.predicted_step_peak_bytes - 1
    assert expected == pytest.approx(comparison.peak_error)
    assert sentence.startswith(f"mlp-rotor: whole-step peak predicted {format_bytes(comparison.predicted_step_peak_bytes)}"
                               f", measured {format_bytes(comparison.measured_step_peak_bytes)} ({expected:+.1%})")
