"""Selective recomputation in the Planner view: options on the schedule figure, selective's and torch.compile's
points on the Pareto figure, from a chain whose stages carry options and a run with ``compile_points.json``."""

from __future__ import annotations

import json
from dataclasses import replace

import plotly.graph_objects as go
import plotly.io
import pytest

import planner
from dashboard import callbacks_planner as cp
from dashboard.figures_options import (
    COMPILE_NAME,
    KEEP_ALL,
    SELECTIVE_COLOR,
    compile_trace,
    option_summary,
    pareto_with_options,
    schedule_figure_with_options,
)
from dashboard.figures_planner import schedule_figure
from dashboard.planning import (
    OPTION_COLUMNS,
    model_of_chain,
    planner_model,
    prediction_frame,
    with_option_columns,
)
from memprof.units import format_bytes
from planner.measure.compile_baseline import COMPILE_POINTS_FILE, CompilePoint, write_compile_points
from planner.model.stage_option import StageOption
from planner.model.step import StepCosts
from tests.dashboard.fixtures import HTML_NAME
from tests.planner.chain_strategies import MIB, random_chain

POINTS = (
    CompilePoint(activation_memory_budget=1.0, step_peak_bytes=900 * MIB, held_bytes=300 * MIB, flops=10**9,
                 step_ms=50.0),
    CompilePoint(activation_memory_budget=0.5, step_peak_bytes=800 * MIB, held_bytes=160 * MIB,
                 flops=1_010_000_000, step_ms=52.0),
    CompilePoint(activation_memory_budget=0.1, step_peak_bytes=700 * MIB, held_bytes=30 * MIB,
                 flops=1_140_000_000, step_ms=60.0),
)


def option_chain(step: bool = True) -> planner.Chain:
    """A 6-stage chain whose stages offer "compute" (half of what F_all keeps) and "none" (the output only);
    stage 2's "none" is named with markup, which must reach the page escaped."""
    chain = random_chain(seed=3, length=6)
    stages = []
    for index, stage in enumerate(chain.stages, start=1):
        middle = (stage.output_bytes + stage.saved_bytes) // 2
        last = HTML_NAME if index == 2 else "none"
        options = (StageOption(name="compute", saved_bytes=middle, recompute_ms=0.2 * stage.forward_ms),
                   StageOption(name=last, saved_bytes=stage.output_bytes, recompute_ms=stage.forward_ms))
        stages.append(replace(stage, name=f"block{index}", options=options))
    chain = replace(chain, stages=tuple(stages))
    if not step:
        return chain
    return chain.with_step(StepCosts(model_state_bytes=500 * MIB, inputs_bytes=2 * MIB, outside_bytes=8 * MIB,
                                     before_peak_bytes=520 * MIB, after_peak_bytes=530 * MIB))


def _tight_frame(model):  # noqa: ANN001, ANN202 -- the tightest schedule of a PlannerModel
    schedule = model.front.schedule_at(model.min_budget_bytes)
    prediction = planner.simulate(model.chain, schedule)
    return schedule, with_option_columns(prediction_frame(prediction), prediction, model.chain)


def test_option_columns_name_each_f_all_option() -> None:
    model = model_of_chain(option_chain())
    schedule, frame = _tight_frame(model)
    assert set(OPTION_COLUMNS) <= set(frame.columns)
    used = [op for op in schedule.ops if op.option]
    assert used, "the tightest budget picks options"
    rows = frame[frame["option"] > 0]
    assert list(zip(rows["stage"], rows["option"])) == [(op.stage, op.option) for op in used]
    for _, row in rows.iterrows():
        chosen = model.chain.stage(int(row["stage"])).options[int(row["option"]) - 1]
        assert row["option_name"] == chosen.name and row["option_saved_bytes"] == chosen.saved_bytes
        assert row["option_recompute_ms"] == pytest.approx(chosen.recompute_ms)
        assert row["stage_saved_bytes"] == model.chain.stage(int(row["stage"])).saved_bytes
    plain = model.front.schedule_at(model.max_budget_bytes)  # store-all: no option, the frame as it was
    prediction = planner.simulate(model.chain, plain)
    bare = prediction_frame(prediction)
    assert with_option_columns(bare, prediction, model.chain) is bare


def test_schedule_figure_colours_and_labels_each_option() -> None:
    model = model_of_chain(option_chain())
    schedule, frame = _tight_frame(model)
    fig = go.Figure(schedule_figure_with_options(frame, model.chain.module_names))  # validates the dict
    by_name = {t.name: t for t in fig.data}
    used = {model.chain.stage(op.stage).options[op.option - 1].name for op in schedule.ops if op.option}
    shown = {name.replace("<", "&lt;").replace(">", "&gt;") for name in used}
    assert {f"F_all [{n}]" for n in shown} <= set(by_name)
    colours = {by_name[f"F_all [{n}]"].marker.color for n in shown}
    assert len(colours) == len(shown)  # one colour per option
    for name in shown:
        bars = by_name[f"F_all [{name}]"]
        assert set(bars.text) == {name} and bars.textposition == "inside"
        assert f"option {name} keeps %{{customdata[2]}}" in bars.hovertemplate
        assert "B recomputes" in bars.hovertemplate
        for stage, custom in zip(bars.y, bars.customdata):
            option = next(op.option for op in schedule.ops if op.stage == stage and op.option)
            chosen = model.chain.stage(int(stage)).options[option - 1]
            assert custom[1] == f"F_all({stage})[{option}]" and custom[2] == format_bytes(chosen.saved_bytes)
    assert not any("<img" in str(t.name) for t in fig.data)
    # every operation is drawn once: plain ones as before, the F_all that keeps everything renamed
    assert sum(len(t.x) for t in fig.data) == len(schedule.ops)
    plain_f_all = [op for op in schedule.ops if op.kind.value == "F_all" and not op.option]
    assert (len(by_name[KEEP_ALL].x) if KEEP_ALL in by_name else 0) == len(plain_f_all)
    assert "recomputation option" in fig.layout.title.text
    # a frame without options is drawn exactly as schedule_figure draws it
    bare = frame[frame["option"] == 0].drop(columns=list(OPTION_COLUMNS))
    assert plotly.io.to_json(schedule_figure_with_options(bare, model.chain.module_names)) == \
        plotly.io.to_json(schedule_figure(bare, model.chain.module_names))


def test_option_summary_lists_what_each_option_keeps() -> None:
    model = model_of_chain(option_chain())
    schedule, frame = _tight_frame(model)
    lines = option_summary(frame).splitlines()
    used = [op for op in schedule.ops if op.option]
    assert len(lines) == len(used)
    first = model.chain.stage(used[0].stage)
    assert lines[0].startswith(f"F_all({used[0].stage})[{used[0].option}] {first.options[used[0].option - 1].name}: "
                               f"keeps {format_bytes(first.options[used[0].option - 1].saved_bytes)} of "
                               f"{format_bytes(first.saved_bytes)}, B recomputes ")
    assert option_summary(frame.drop(columns=list(OPTION_COLUMNS))) == ""


def test_pareto_shows_selective_rotor_and_compile_points_together() -> None:
    chain = option_chain()
    model = model_of_chain(chain, compile_points=POINTS)
    assert model.algorithm == "selective" and model.compile_points == POINTS
    fig = go.Figure(model.pareto)
    by_name = {t.name: t for t in fig.data}
    assert {"rotor", "selective", "store_all", COMPILE_NAME, "selective optimum by budget"} <= set(by_name)
    assert by_name["selective"].marker.color == SELECTIVE_COLOR
    selective_rows = model.points[model.points["algorithm"] == "selective"]
    assert sorted(by_name["selective"].x) == sorted(selective_rows["peak_bytes"])
    compiled = by_name[COMPILE_NAME]
    # the matching quantity: the measured whole-step peak against the planner's predicted whole-step peaks
    assert list(compiled.x) == [700 * MIB, 800 * MIB, 900 * MIB] and list(compiled.y) == [60.0, 52.0, 50.0]
    assert list(compiled.text) == ["budget 0.1", "budget 0.5", "budget 1"]
    assert compiled.marker.symbol == "diamond"
    assert "measured step peak" in compiled.hovertemplate and "predicted whole-step peaks" in compiled.hovertemplate
    assert compiled.customdata[0][3] == "1.14e+09 (+14.0% over budget 1.0)"
    # the x axis spans the compile points too (they may sit beside the planner's)
    ticks = list(fig.layout.xaxis.tickvals)
    assert ticks[0] <= 700 * MIB and ticks[-1] >= max(900 * MIB, float(model.points["peak_bytes"].max()))
    assert fig.layout.xaxis.title.text == "whole-step peak memory (GiB)"


def test_inductor_points_without_flops_say_not_counted() -> None:
    points = [CompilePoint(activation_memory_budget=b, step_peak_bytes=int((700 + 100 * b) * MIB), held_bytes=0,
                           flops=0, step_ms=50.0 + b) for b in (1.0, 0.5)]
    trace = compile_trace(points)
    assert [row[3] for row in trace["customdata"]] == ["not counted", "not counted"]


def test_pareto_leaves_compile_points_out_of_a_chain_only_figure_and_says_why() -> None:
    model = model_of_chain(option_chain(step=False), compile_points=POINTS)
    fig = go.Figure(model.pareto)
    assert COMPILE_NAME not in {t.name for t in fig.data}
    assert "not drawn on this chain-only figure" in fig.layout.annotations[0].text
    broken = go.Figure(pareto_with_options(model.points, model.front.budgets_bytes, model.front.makespans_ms,
                                           compile_error="<b>bad</b> file"))
    assert broken.layout.annotations[0].text == "torch.compile's points left out: &lt;b&gt;bad&lt;/b&gt; file"
    assert broken.data[0].name == "rotor optimum by budget"


def test_a_chain_without_options_keeps_rotor() -> None:
    chain = random_chain(seed=3, length=6)
    model = model_of_chain(chain)
    assert model.algorithm == "rotor" and "selective" not in set(model.points["algorithm"])
    assert go.Figure(model.pareto).data[0].name == "rotor optimum by budget"


def test_planner_view_shows_the_options_and_the_compile_points(store, monkeypatch) -> None:  # noqa: ANN001
    model = model_of_chain(option_chain(), compile_points=POINTS)
    monkeypatch.setattr(cp, "planner_model", lambda *a: model)
    *_, message = cp.planner_bounds(store, ["mlp"], cp.AUTO)
    assert "7 stages have recomputation options" in message and "selective's optimum" in message
    assert "torch.compile's 3 measured points" in message
    _, _, _, ops_text, schedule_fig, pareto_fig, _ = cp.planner_view(store, ["mlp"], cp.AUTO,
                                                                    model.min_budget_bytes)
    schedule = model.front.schedule_at(model.min_budget_bytes)
    assert schedule.algorithm == "selective"
    assert ops_text.startswith(" ".join(str(op) for op in schedule.ops) + "\n\nrecomputation options:\n")
    assert "[1]" in ops_text or "[2]" in ops_text
    names = {t.name for t in go.Figure(schedule_fig).data}
    assert any(n.startswith("F_all [") for n in names)
    option = next(t for t in schedule_fig["data"] if t["name"].startswith("F_all ["))
    assert "memory: up to %{customdata[5]} while it runs" in option["hovertemplate"]
    assert all(text.endswith("iB") or text.endswith(" B") for row in option["customdata"] for text in row[5:])
    pareto = go.Figure(pareto_fig)
    assert {COMPILE_NAME, "selective", "rotor", "this schedule"} <= {t.name for t in pareto.data}
    choice = {"run": "mlp", "container": None, "budget_bytes": model.min_budget_bytes}
    used = sum(1 for op in schedule.ops if op.option)
    summary = cp.export_summary(store, choice, ["mlp"])
    assert summary.startswith("selective schedule of run mlp") and summary.endswith(
        f" {used} recorded forwards keep less than everything (recomputation options).")


def test_planner_model_reads_the_compile_points_beside_the_run(store) -> None:  # noqa: ANN001
    before = planner_model(store, "mlp", None)
    assert before.compile_points == () and before.algorithm == "rotor"  # the synthetic run has no op records
    write_compile_points(store.path("mlp"), POINTS)  # written after the run: the cache must see it
    model = planner_model(store, "mlp", None)
    assert model.compile_points == POINTS and model.compile_error == ""
    assert COMPILE_NAME in {t.name for t in go.Figure(model.pareto).data}
    (store.path("mlp") / COMPILE_POINTS_FILE).write_text(json.dumps({"points": [{"step_ms": 1}]}), encoding="utf-8")
    broken = planner_model(store, "mlp", None)
    assert broken.compile_points == () and "compile_points.json is not a list" in broken.compile_error
    assert "torch.compile's points left out" in go.Figure(broken.pareto).layout.annotations[0].text


def test_offload_points_of_a_run_without_a_device_link_need_a_gpu() -> None:
    from dashboard.figures_options import needs_a_gpu, pareto_with_options

    chain = random_chain(seed=3, length=6)
    model = model_of_chain(chain, device_link=False)
    points = model.points
    assert "offload" in set(points["algorithm"])  # the planner prices them with its default link
    names = [t["name"] for t in model.pareto["data"]]
    assert "offload (needs a GPU)" in names and "offload" not in names
    marked = next(t for t in model.pareto["data"] if t["name"] == "offload (needs a GPU)")
    assert marked["marker"]["symbol"] == "circle-open" and "needs a GPU" in marked["hovertemplate"]
    linked = pareto_with_options(points, model.front.budgets_bytes, model.front.makespans_ms, device_link=True)
    assert "offload" in [t["name"] for t in linked["data"]]
    assert needs_a_gpu({"name": "x", "hovertemplate": "a<extra>x</extra>"})["name"] == "x (needs a GPU)"


def test_only_a_cuda_run_or_a_measured_link_has_a_device_link() -> None:
    from dashboard.planning import has_device_link

    chain = random_chain(seed=3, length=6)  # priced with the planner's default link
    assert not has_device_link({"device": "cpu"}, chain)
    assert has_device_link({"device": "cuda:0"}, chain)
