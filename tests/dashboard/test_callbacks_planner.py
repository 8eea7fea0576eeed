"""Planner and Export callbacks: slider bounds from the front, no re-solve, downloads, measured overlay.

The synthetic run's chain carries step costs, so the slider, texts and figures are in whole-step bytes.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

import planner
from dashboard import callbacks_planner as cp
from dashboard.data import UnsafeRunPathError
from dashboard.planning import PlannerModel, planner_model
from memprof import load_trace
from memprof.units import format_bytes
from planner.model.step import StepCosts
from tests.dashboard.fixtures import (
    HTML_NAME,
    WEIGHTS_BYTES,
    event_rows,
    iteration_row,
    layer_rows,
    meta,
    write_measured_run,
)


def test_container_of():
    assert cp.container_of(cp.AUTO) is None
    assert cp.container_of(None) is None
    assert cp.container_of("module:features") == "features"
    assert cp.container_of("module:") == ""


def test_chain_options(store):
    options, value = cp.chain_options(store, ["mlp"])
    assert value == cp.AUTO
    assert [o["value"] for o in options] == [cp.AUTO, "module:features"]
    assert cp.chain_options(store, ["corrupt"])[0] == [options[0]]
    assert cp.chain_options(store, None)[0] == [options[0]]
    assert cp.container_label("features") == "children of features"
    assert cp.container_label("") == "children of the model itself (the root)"  # not "children of "


def test_no_run_no_plan(store):
    assert cp.planner_bounds(store, [], cp.AUTO)[-1] == "Choose a run on the Runs tab."
    assert cp.planner_view(store, [], cp.AUTO, 5)[-1] is None
    assert cp.measured_view(store, [])[0].children == "Choose a run on the Runs tab."
    assert cp.export_summary(store, None, []).startswith("Nothing to export yet: no run chosen")


@pytest.mark.parametrize("name", ["corrupt", "../outside"])
def test_bad_runs_give_messages(store, name):
    low, high, _, _, _, disabled, message = cp.planner_bounds(store, [name], cp.AUTO)
    # a run that cannot be opened says so in its one problem line (TraceStore.problem), the same on every tab
    said = (f"No plan for {name}: ", f"Run {name} cannot be opened: ")
    assert disabled and message.startswith(said)
    view = cp.planner_view(store, [name], cp.AUTO, 5)
    assert view[-1] is None and (view[0] == "" or view[0].startswith(said))  # "": said once, above the slider


def test_slider_bounds_are_the_fronts(store):
    chain = planner.chain_from_trace(load_trace(store.path("mlp")))
    front = planner.pareto_front(chain)
    low, high, step, marks, value, disabled, message = cp.planner_bounds(store, ["mlp"], cp.AUTO)
    # whole-step budgets: from the least the step can run in to store-all's whole-step peak
    assert (low, high) == (front.min_feasible_bytes, front.max_budget_bytes)
    assert (low, high) == (planner.min_feasible_budget(chain), planner.store_all_budget(chain))
    assert not disabled and low <= value <= high
    assert step == pytest.approx((high - low) / 100)
    assert marks == {str(low): format_bytes(low), str(high): format_bytes(high)}
    assert message.startswith(f"Chain {chain.name}: features.0, features.1, features." + HTML_NAME)
    assert (f"Budgets are the whole training step's memory: {format_bytes(chain.step.base_bytes)} stays beside "
            "the chain") in message
    assert f"no schedule goes below {format_bytes(chain.step.floor_bytes)}" in message
    assert message.endswith(f"Budgets from {format_bytes(low)} (the minimum feasible) to {format_bytes(high)} "
                            "(store-all).")


def test_slider_says_when_the_step_outside_the_chain_sets_the_minimum(store, monkeypatch):
    found = planner_model(store, "mlp", None)
    step = found.step
    floor = found.max_budget_bytes - 1000  # the optimizer step outgrows almost every schedule
    chain = found.chain.with_step(StepCosts(**{**step.to_dict(), "after_peak_bytes": floor}))
    front = planner.pareto_front(chain)
    model = PlannerModel(chain, front, planner.algorithm_points(chain), 0, found.pareto)
    monkeypatch.setattr(cp, "planner_model", lambda *a: model)
    low, high, *_, disabled, message = cp.planner_bounds(store, ["mlp"], cp.AUTO)
    assert low == floor and not disabled
    assert message.endswith(f" The minimum is set outside the chain: {chain.step.explain_floor()}.")
    # the floor above store-all: one budget, the floor
    higher = chain.with_step(StepCosts(**{**step.to_dict(), "after_peak_bytes": found.max_budget_bytes + 1}))
    model = PlannerModel(higher, planner.pareto_front(higher), model.points, 0, found.pareto)
    low, high, *_, disabled, message = cp.planner_bounds(store, ["mlp"], cp.AUTO)
    assert low == high == found.max_budget_bytes + 1 and disabled
    assert "Store-all is already the minimum. The minimum is set outside the chain: " in message


def test_slider_reads_the_front_and_simulates(store, monkeypatch):
    model = planner_model(store, "mlp", None)
    step = model.step
    # Moving the slider must not solve again.
    monkeypatch.setattr(planner, "pareto_front", lambda *a, **k: pytest.fail("pareto_front called again"))
    monkeypatch.setattr(planner, "solve", lambda *a, **k: pytest.fail("solve called"))
    seen = []
    for budget in (model.min_budget_bytes, (model.min_budget_bytes + model.max_budget_bytes) / 2,
                   model.max_budget_bytes):
        budget_text, peak_text, makespan_text, ops_text, *figures, choice = \
            cp.planner_view(store, ["mlp"], cp.AUTO, budget)
        planned, pareto_fig = (go.Figure(f) for f in figures)
        # one figure, one time axis: the operations on the top row (y), the memory they cause below (y2)
        bars = [t for t in planned.data if t.yaxis == "y"]
        memory = [t for t in planned.data if t.yaxis == "y2"]
        assert {t.xaxis for t in planned.data} == {"x"} and planned.layout.xaxis.anchor == "y2"
        assert planned.layout.yaxis.domain[0] > planned.layout.yaxis2.domain[1]  # schedule above memory
        schedule = model.front.schedule_at(int(round(budget)))
        prediction = planner.simulate(model.chain, schedule)
        step_peak = step.step_peak_bytes(prediction.peak_bytes)
        assert ops_text == " ".join(str(op) for op in schedule.ops)
        assert makespan_text.startswith(f"predicted makespan {prediction.makespan_ms:.3f} ms")
        assert peak_text == (f"predicted step peak {format_bytes(step_peak)} (the chain's own "
                             f"{format_bytes(prediction.peak_bytes)})")
        assert step_peak == schedule.predicted_step_peak_bytes <= int(round(budget))
        left = step.chain_budget_bytes(int(round(budget)))
        assert budget_text == (f"budget {format_bytes(int(round(budget)))} for the whole step "
                               f"({format_bytes(step.base_bytes)} beside the chain leaves it {format_bytes(left)})")
        # the predicted timeline is the simulator's chain timeline plus what the step holds beside the chain
        assert max(memory[0].y) == prediction.peak_bytes + step.base_bytes
        assert memory[0].name == f"predicted (chain + {format_bytes(step.base_bytes)} beside it)"
        assert [(s.y0, s.yref) for s in planned.layout.shapes] == [(int(round(budget)), "y2"),
                                                                   (step.floor_bytes, "y2")]
        # each operation's hover says the whole-step memory it causes, the same as the memory row's peak
        assert format_bytes(prediction.peak_bytes + step.base_bytes) in {row[1] for t in bars for row in t.customdata}
        star = pareto_fig.layout.annotations[-1]
        assert (star.x, star.y) == (step_peak, pytest.approx(prediction.makespan_ms)) and star.text == "\u2605"
        assert pareto_fig.layout.shapes[0].x0 == int(round(budget))
        assert pareto_fig.layout.xaxis.title.text.startswith("whole-step peak memory (")
        assert pareto_fig.layout.xaxis.title.text.endswith("iB)")
        assert sum(len(t.x) for t in bars) == len(schedule.ops)
        assert choice == {"run": "mlp", "container": None, "budget_bytes": int(round(budget))}
        seen.append(makespan_text)
    assert seen[0] != seen[-1]  # the tightest budget recomputes, store-all does not


def test_schedule_labels_are_escaped(store):
    model = planner_model(store, "mlp", None)
    fig = go.Figure(cp.planner_view(store, ["mlp"], cp.AUTO, model.max_budget_bytes)[4])
    labels = [row[0] for t in fig.data if t.yaxis == "y" for row in t.customdata]
    assert any("&lt;img" in label for label in labels) and not any("<img" in label for label in labels)


def test_measured_view_states_errors(store):
    blocks = cp.measured_view(store, ["mlp"])
    assert len(blocks) == 1
    sentence = blocks[0].children[0].children
    run = cp.compare_measured(store, "mlp-measured")
    comparison = run.comparison
    assert sentence.startswith(f"mlp-measured: whole-step peak predicted {format_bytes(comparison.predicted_peak_bytes)}"
                               f", measured {format_bytes(comparison.measured_peak_bytes)} "
                               f"({comparison.peak_error:+.1%}); time predicted ")
    graph = go.Figure(blocks[0].children[1].figure)
    base = format_bytes(run.base_bytes)
    assert [t.name for t in graph.data][:2] == [f"predicted (chain + {base} beside it)", "measured (mlp-measured)"]
    # every event's memory, each after the highest the allocator held since the event before
    assert list(graph.data[1].y)[::2] == run.measured["memory_bytes"].tolist()
    assert max(graph.data[1].y) == max(run.measured["peak_bytes"].max(), run.measured["memory_bytes"].max())
    assert graph.layout.title.text == "store_all schedule: predicted and measured (whole training step)"


def test_measured_view_of_a_chain_only_schedule(store, traces):
    write_measured_run(traces.root / "mlp-chain-only", "mlp-chain-only", source_run="mlp", step=False)
    blocks = {b.children[0].children.split(":")[0]: b for b in cp.measured_view(store, ["mlp"])}
    assert set(blocks) == {"mlp-measured", "mlp-chain-only"}
    block = blocks["mlp-chain-only"]
    assert block.children[0].children.startswith("mlp-chain-only: activation peak predicted ")
    graph = go.Figure(block.children[1].figure)
    assert [t.name for t in graph.data] == ["predicted", "measured (mlp-chain-only)"]
    assert graph.layout.title.text.endswith("(activations)")


def test_current_schedule_measured_is_overlaid(store, traces):
    # A measured run of exactly the schedule the slider shows at store-all.
    model = planner_model(store, "mlp", None)
    schedule = model.front.schedule_at(model.max_budget_bytes)
    from memprof.trace.format.writer import TraceWriter, write_meta

    run_dir = traces.root / "mlp-measured-rotor"
    writer = TraceWriter(run_dir)
    events = event_rows(0, [("other", "", "start", 100), ("forward", "a", "enter", 100),
                            ("backward", "a", "end", 300)])
    writer.append("events", events)
    writer.append("iterations", [iteration_row(0, events)])
    writer.append("layers", layer_rows(0))
    write_meta(run_dir, meta("mlp-measured-rotor", schedule=schedule.to_dict(), source_run="mlp"))
    # The same operations solved for the chain alone: measured as activations, so not drawn in whole-step terms.
    other = traces.root / "mlp-measured-chain-only"
    writer = TraceWriter(other)
    writer.append("events", events)
    writer.append("iterations", [iteration_row(0, events)])
    writer.append("layers", layer_rows(0))
    alone = planner.pareto_front(model.chain.activations_only()).schedule_at(10**12)
    assert alone.ops == schedule.ops
    write_meta(other, meta("mlp-measured-chain-only", schedule=alone.to_dict(), source_run="mlp"))
    _, peak_text, makespan_text, _, planned, _, _ = cp.planner_view(store, ["mlp"], cp.AUTO,
                                                                    model.max_budget_bytes)
    comparison = cp.compare_measured(store, "mlp-measured-rotor").comparison
    assert peak_text.endswith(f"; measured {format_bytes(comparison.measured_peak_bytes)} "
                              f"({comparison.peak_error:+.1%})")
    assert "; measured " in makespan_text
    memory = [t for t in go.Figure(planned).data if t.yaxis == "y2"]
    assert [t.name for t in memory] == [f"predicted (chain + {format_bytes(model.step.base_bytes)} beside it)",
                                        "measured (mlp-measured-rotor)"]
    # whole-step allocated memory: the weights and their gradients are not taken away
    assert list(memory[1].y)[-1] == 300 + 2 * WEIGHTS_BYTES


def test_exports(store):
    model = planner_model(store, "mlp", None)
    choice = {"run": "mlp", "container": None, "budget_bytes": model.min_budget_bytes}
    download = cp.export_json(store, choice, ["mlp"])
    assert download["filename"].endswith(".json")
    schedule = planner.Schedule.from_json(json.loads(download["content"]))
    expected = model.front.schedule_at(model.min_budget_bytes)
    assert schedule.ops == expected.ops and schedule.budget_bytes == model.min_budget_bytes
    assert schedule.predicted_peak_bytes == planner.simulate(model.chain, expected).peak_bytes
    assert schedule.predicted_step_peak_bytes == model.step.step_peak_bytes(schedule.predicted_peak_bytes)
    assert schedule.chain.step == model.step
    python = cp.export_python(store, choice, ["mlp"])
    assert python["filename"] == "apply_schedule.py"  # the name its usage lines import
    compile(python["content"], python["filename"], "exec")
    summary = cp.export_summary(store, choice, ["mlp"])
    assert summary.startswith(f"rotor schedule of run mlp, chain {model.chain.name}, at budget "
                              f"{format_bytes(model.min_budget_bytes)} for the whole step: ")
    assert (f"{len(expected.ops)} operations, predicted peak {format_bytes(schedule.predicted_step_peak_bytes)} "
            f"for the whole step (the chain's own {format_bytes(schedule.predicted_peak_bytes)})") in summary


def test_export_without_a_choice_uses_the_default_budget(store):
    model = planner_model(store, "mlp", None)
    schedule = cp.current_schedule(store, None, ["mlp"])
    default = (model.min_budget_bytes + model.max_budget_bytes) // 2
    assert schedule.ops == model.front.schedule_at(default).ops


def test_export_refuses_a_run_outside(store):
    with pytest.raises(UnsafeRunPathError, match="climbs out"):
        cp.current_schedule(store, {"run": "../x", "container": None, "budget_bytes": 5}, None)


def test_slider_minimum_and_front_agree_with_memprof_plan_to_the_byte(store, traces, tmp_path, capsys):
    import re

    from cli.main import main

    low, high = cp.planner_bounds(store, ["mlp"], cp.AUTO)[:2]
    model = planner_model(store, "mlp", None)
    code = main(["plan", str(traces.root / "mlp"), "--budget", "1", "--algorithm", model.algorithm,
                 "--out", str(tmp_path / "s.json")])
    said = capsys.readouterr().err
    assert code != 0
    smallest = int(re.search(r"smallest budget for \w+ is [^(]+\((\d+) bytes\)", said).group(1))
    assert low == smallest == int(model.front.budgets_bytes[0])  # the slider, the front's line and the CLI
    # at the minimum the CLI solves the schedule the slider shows
    assert main(["plan", str(traces.root / "mlp"), "--budget", str(low), "--algorithm", model.algorithm,
                 "--out", str(tmp_path / "s.json")]) == 0
    solved = planner.Schedule.from_json(json.loads((tmp_path / "s.json").read_text()))
    assert solved.ops == model.front.schedule_at(low).ops
    assert high == model.max_budget_bytes
