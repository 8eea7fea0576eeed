"""The budget slider's views: every position drawn in the page is what the server draws there, made without solving.

``assets/planner.js`` lays a position's layout keys over its schedule's figure; :func:`_shown` does the same
here, and every position must then equal :func:`dashboard.callbacks_planner.planner_view` at its budget.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.io
import pytest

import planner
from dashboard import callbacks_planner as cp
from dashboard import callbacks_slider as cs
from dashboard.planning import SLIDER_STEPS, default_budget, model_of_chain, planner_model
from dashboard.slider_views import slider_budgets, slider_views, snapped_budget
from tests.dashboard.fixtures import write_chain_run


def _json(value: Any) -> Any:
    """``value`` as the page receives it (numpy arrays as lists)."""
    return json.loads(plotly.io.json.to_json_plotly(value))


def _shown(views: dict, k: int) -> list[Any]:
    """Position ``k``'s seven outputs, put together as ``assets/planner.js`` does."""
    at = views["positions"][k]
    shown = views["schedules"][at["schedule"]]
    figure = {"data": shown["figure"]["data"], "layout": {**shown["figure"]["layout"], **at["figure"]}}
    pareto = {"data": views["pareto"]["data"], "layout": {**views["pareto"]["layout"], **at["pareto"]}}
    choice = {"run": views["run"], "container": views["container"], "budget_bytes": views["budgets"][k]}
    return [at["budget_text"], *shown["texts"], figure, pareto, choice]


def test_slider_budgets_run_from_the_minimum_through_the_default_to_store_all(store):
    model = planner_model(store, "mlp", None)
    budgets = slider_budgets(model)
    assert len(budgets) == SLIDER_STEPS + 1 and budgets == sorted(budgets)
    assert (budgets[0], budgets[SLIDER_STEPS // 2], budgets[-1]) == (
        model.min_budget_bytes, default_budget(model), model.max_budget_bytes)
    step = (budgets[-1] - budgets[0]) / SLIDER_STEPS  # the slider reports min + k * step
    assert [snapped_budget(model, budgets[0] + k * step) for k in range(SLIDER_STEPS + 1)] == budgets
    assert snapped_budget(model, budgets[-1] + 10**9) == budgets[-1] and snapped_budget(model, 0) == budgets[0]


def test_every_position_shows_what_the_server_shows_there(store, monkeypatch):
    model = planner_model(store, "mlp", None)
    monkeypatch.setattr(planner, "pareto_front", lambda *a, **k: pytest.fail("solved again"))
    views = cs.planner_views(store, ["mlp"], cp.AUTO)
    assert views is not None and (views["run"], views["choice"], views["container"]) == ("mlp", cp.AUTO, None)
    assert views["inputs"] and all(views["positions"])
    assert 1 < len(views["schedules"]) < len(views["positions"])  # few distinct schedules, one figure each
    for k, budget in enumerate(slider_budgets(model)):
        assert _json(_shown(views, k)) == _json(list(cp.planner_view(store, ["mlp"], cp.AUTO, budget))), k
    assert cs.planner_views(store, ["mlp"], cp.AUTO) is views  # cached: the page gets the same once per chain


def test_views_of_a_long_chain_stay_small_and_hold_at_most_their_operations(tmp_path):
    from dashboard.data import TraceStore

    write_chain_run(tmp_path / "deep", 50)  # as the slider's benchmark
    store = TraceStore(tmp_path)
    views = cs.planner_views(store, ["deep"], cp.AUTO)
    assert views is not None and all(views["positions"])
    size = len(plotly.io.json.to_json_plotly(views))
    assert size < 8 * 2**20, size  # sent once when the Planner tab opens
    assert views.nbytes >= size  # what the cache counts of them (BoundedCache bounds its bytes)
    model = planner_model(store, "deep", None)
    k = 37
    assert _json(_shown(views, k)) == _json(list(cp.planner_view(store, ["deep"], cp.AUTO, slider_budgets(model)[k])))
    # past the cap, positions are left to the server
    capped = slider_views(model, [], "deep", cp.AUTO, None, max_ops=len(model.front.schedule_at(
        model.min_budget_bytes).ops))
    assert capped["positions"][0] is not None and capped["positions"][-1] is None
    assert len(capped["schedules"]) == 1


def test_a_chain_whose_minimum_is_store_all_has_one_position():
    from dataclasses import replace

    from tests.planner.chain_strategies import random_chain

    model = model_of_chain(random_chain(seed=1, length=3))
    pinned = replace(model, front=replace(model.front, min_feasible_bytes=model.front.max_budget_bytes))
    views = slider_views(pinned, [], "run", cp.AUTO, None)
    assert views["budgets"] == [pinned.max_budget_bytes] and views["step"] == 0 and len(views["positions"]) == 1


def test_served_view_snaps_to_the_sliders_position_and_echoes_the_request(store):
    model = planner_model(store, "mlp", None)
    value = model.min_budget_bytes + 3.4 * (model.max_budget_bytes - model.min_budget_bytes) / SLIDER_STEPS
    served = cs.served_view(store, {"run": "mlp", "choice": cp.AUTO, "value": value})
    assert served["key"] == ["mlp", cp.AUTO, value]
    assert served["outputs"][-1]["budget_bytes"] == slider_budgets(model)[3]
    assert _json(served["outputs"]) == _json(list(cp.planner_view(store, ["mlp"], cp.AUTO, slider_budgets(model)[3])))
    # no run, or a run without a plan: the server's messages, as before
    assert cs.served_view(store, None)["outputs"][-1] is None
    assert cs.served_view(store, {"run": "corrupt", "choice": cp.AUTO, "value": 5})["outputs"][-1] is None


def test_no_views_without_a_plan(store):
    assert cs.planner_views(store, [], cp.AUTO) is None
    assert cs.planner_views(store, ["corrupt"], cp.AUTO) is None


def test_views_name_the_planner_inputs_the_live_planner_draws(store):
    from dashboard.live_planner import drawn_inputs

    # the page draws the views only while they are of the model the Planner shows (a live run's changes)
    views = cs.planner_views(store, ["mlp"], cp.AUTO)
    assert views is not None and views["inputs"] == drawn_inputs(store, ["mlp"], cp.AUTO)["inputs"]


def test_a_streaming_schedule_shows_the_step_it_runs(store):
    """A schedule that streams weights keeps their state in host memory: its view's step peak is that step's, the
    schedule's own prediction, not the chain's step with every weight on the device."""
    from dashboard.slider_views import schedule_view
    from memprof.units import format_bytes
    from planner.solvers.dispatch import min_feasible_budget

    model = planner_model(store, "mlp", None)
    assert model.chain.weights is not None and model.step is not None
    budget = min_feasible_budget(model.chain, "offload", stream_weights=True)
    schedule = planner.solve(model.chain, budget, "offload", stream_weights=True)
    assert schedule.streamed_weights and schedule.predicted_step_peak_bytes is not None
    view = schedule_view(model, schedule)
    shown = view.peak_text
    assert view.peak_bytes == schedule.predicted_step_peak_bytes
    assert f"predicted step peak {format_bytes(schedule.predicted_step_peak_bytes)}" in shown
    resident = model.step.step_peak_bytes(int(schedule.predicted_peak_bytes or 0))
    assert resident > schedule.predicted_step_peak_bytes
    assert f"predicted step peak {format_bytes(resident)}" not in shown


def test_the_makespan_says_how_the_layer_times_were_scaled(store):
    """A chain costed from a run that went steady predicts the step without the profiler's hooks: the view says
    by how much the recorded layer times were scaled, and says nothing for times as recorded."""
    from dataclasses import replace

    from dashboard.slider_views import schedule_view, time_basis_text
    from planner.discovery.time_scale import TimeScale

    model = planner_model(store, "mlp", None)
    scale = TimeScale(forward=0.5, backward=0.9, basis="steady", clock="host", iterations=3)
    scaled = model_of_chain(replace(model.chain, source={**model.chain.source, "time_scale": scale.to_json()}))
    schedule = scaled.front.schedule_at(scaled.max_budget_bytes)
    text = schedule_view(scaled, schedule).makespan_text
    assert text.endswith("; layer times scaled to 3 steady iterations (hooks off): forward x0.50, backward x0.90")
    assert time_basis_text(None) == "" == time_basis_text(TimeScale().to_json())
