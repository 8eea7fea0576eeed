"""Planner figures from hand-made prediction frames: bars per op, memory line, Pareto curves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures_pareto import pareto_base, pareto_figure, with_current
from dashboard.figures_planner import (
    memory_figure,
    predicted_line,
    schedule_figure,
    schedule_text,
)
from tests.dashboard.fixtures import HTML_NAME


def _prediction():
    # Two stages and the loss, store-all: F_all(1) F_all(2) F_all(3) B(3) B(2) B(1).
    kinds = ["F_all", "F_all", "F_all", "B", "B", "B"]
    stages = [1, 2, 3, 3, 2, 1]
    durations = [1.0, 2.0, 0.5, 0.5, 4.0, 2.0]
    end = np.cumsum(durations)
    return pd.DataFrame({"index": range(6), "kind": kinds, "stage": stages, "start_ms": end - durations,
                         "end_ms": end, "memory_bytes": [10, 30, 31, 30, 10, 0],
                         "peak_bytes": [12, 35, 31, 33, 40, 15]})


def test_schedule_figure_draws_each_op_as_a_bar():
    fig = go.Figure(schedule_figure(_prediction(), ["a", HTML_NAME]))  # validates the figure dict
    bars = {t.name: t for t in fig.data}
    assert set(bars) == {"F_all", "B"}
    assert list(bars["F_all"].base) == [0.0, 1.0, 3.0]
    assert list(bars["F_all"].x) == [1.0, 2.0, 0.5]
    assert list(bars["B"].y) == [3, 2, 1]
    assert [c[0] for c in bars["B"].customdata] == ["loss", "&lt;img src=x onerror=alert(1)&gt;", "a"]
    # hovering an operation says the memory it causes: its peak while it runs and what it leaves
    assert [c[1:] for c in bars["B"].customdata] == [["33 B", "30 B"], ["40 B", "10 B"], ["15 B", "0 B"]]
    assert "memory: up to %{customdata[1]} while it runs, %{customdata[2]} after" in bars["B"].hovertemplate
    whole = go.Figure(schedule_figure(_prediction(), ["a", "b"], base_bytes=100))
    assert [c[1:] for c in whole.data[1].customdata] == [["133 B", "130 B"], ["140 B", "110 B"], ["115 B", "100 B"]]
    assert list(fig.layout.yaxis.ticktext) == ["1 a", "2 &lt;img src=x onerror=alert(1)&gt;", "3 loss"]


def test_long_chains_are_not_labelled_row_by_row():
    names = [f"layer{i}" for i in range(60)]
    frame = pd.DataFrame({"kind": ["F_all"] * 61, "stage": range(1, 62), "start_ms": np.arange(61.0),
                          "end_ms": np.arange(1.0, 62.0), "memory_bytes": range(61), "peak_bytes": range(61)})
    fig = go.Figure(schedule_figure(frame, names))
    assert fig.layout.yaxis.ticktext is None and len(fig.data[0].y) == 61


def test_predicted_line_shows_peak_during_and_memory_after():
    x, y = predicted_line(_prediction())
    assert x[:6].tolist() == [0.0, 1.0, 1.0, 1.0, 3.0, 3.0]
    assert y[:6].tolist() == [12, 12, 10, 35, 35, 30]
    assert y.max() == 40


def test_memory_figure_overlays_measured_and_budget():
    measured = pd.DataFrame({"time_ms": [0.0, 5.0, 10.0], "memory_bytes": [5, 38, 1], "peak_bytes": [6, 39, 2]})
    fig = go.Figure(memory_figure(_prediction(), budget_bytes=45, measured=[("<b>run</b>", measured)]))
    predicted, overlay = fig.data
    assert predicted.name == "predicted" and max(predicted.y) == 40
    # each interval's peak (the allocator's, since the previous event), then what the event leaves
    assert list(overlay.y) == [5, 39, 38, 2, 1] and list(overlay.x) == [0.0, 0.0, 5.0, 5.0, 10.0]
    assert overlay.name == "measured (&lt;b&gt;run&lt;/b&gt;)"
    assert fig.layout.shapes[0].y0 == 45 and len(fig.layout.shapes) == 1
    assert fig.layout.annotations[0].text == "budget 45 B"
    assert fig.layout.yaxis.title.text == "activation memory (B)"
    # memory holds between events: every memory line is drawn as steps, its hover in binary units
    assert predicted.line.shape == "hv" and overlay.line.shape == "hv"
    assert list(overlay.customdata) == ["5 B", "39 B", "38 B", "2 B", "1 B"]


def test_whole_step_memory_figure_adds_what_lies_beside_the_chain():
    # the step holds 1000 B beside the chain, and peaks at 1100 B outside it (the optimizer step)
    measured = pd.DataFrame({"time_ms": [0.0, 5.0, 12.0], "memory_bytes": [1005, 1038, 1090],
                             "peak_bytes": [1006, 1039, 1100]})
    fig = go.Figure(memory_figure(_prediction(), budget_bytes=1045, measured=[("run", measured)],
                                  base_bytes=1000, floor_bytes=1100))
    predicted, overlay = fig.data
    x, y = predicted_line(_prediction())
    assert list(predicted.y) == (y + 1000).tolist() and list(predicted.x) == x.tolist()
    assert predicted.name == "predicted (chain + 1000 B beside it)"
    assert list(overlay.y) == [1005, 1039, 1038, 1100, 1090]
    assert [s.y0 for s in fig.layout.shapes] == [1045, 1100]
    assert [a.text for a in fig.layout.annotations] == ["budget 1.0 KiB",
                                                       "step peak outside the chain: 1.1 KiB (no schedule's peak goes below)"]
    assert fig.layout.yaxis.title.text == "whole-step memory (KiB)"
    assert fig.layout.yaxis.automargin  # the title never sits on the tick labels
    assert "whole training step" in fig.layout.title.text and "1000 B held beside it" in fig.layout.title.text
    assert min(fig.layout.yaxis.tickvals) <= 1000 and sum(1000 <= v <= 1100 for v in fig.layout.yaxis.tickvals) >= 3
    # a step holding nothing beside the chain is still a whole-step figure
    empty = go.Figure(memory_figure(_prediction(), base_bytes=0))
    assert max(empty.data[0].y) == 40 and empty.layout.yaxis.title.text == "whole-step memory (B)"


def test_pareto_figure_has_every_algorithm_the_front_and_the_current_point():
    points = pd.DataFrame({"algorithm": ["store_all", "periodic", "periodic", "sqrt", "revolve", "rotor"],
                           "budget_bytes": [100, 80, 60, 70, 40, 50], "peak_bytes": [100, 78, 55, 66, 40, 50],
                           "makespan_ms": [10.0, 12.0, 14.0, 13.0, 30.0, 12.5], "params": [{}] * 6})
    fig = go.Figure(pareto_figure(points, [40, 50, 100], [20.0, 12.5, 10.0], current=(50, 12.5), budget_bytes=52))
    names = [t.name for t in fig.data]
    assert names == ["rotor optimum by budget", "store_all", "periodic", "sqrt", "revolve", "rotor", "this schedule"]
    periodic = fig.data[2]
    assert list(periodic.x) == [55, 78] and list(periodic.y) == [14.0, 12.0]
    star = fig.layout.annotations[-1]  # a layout item: moving it redraws no trace
    assert (star.x, star.y, star.text) == (50, 12.5, "\u2605") and "peak 50 B, 12.500 ms" in star.hovertext
    assert list(fig.data[0].x) == [40, 50, 100]
    assert fig.layout.shapes[0].x0 == 52
    assert fig.layout.xaxis.title.text == "activation memory (B)"
    assert list(fig.data[0].customdata) == ["40 B", "50 B", "100 B"]
    whole = go.Figure(pareto_figure(points, [40, 50, 100], [20.0, 12.5, 10.0], whole_step=True))
    assert whole.layout.xaxis.title.text == "whole-step peak memory (B)"
    assert whole.layout.xaxis.tickvals[0] <= 40 and len(whole.layout.xaxis.tickvals) >= 4
    assert whole.layout.title.text.startswith("Whole-step memory vs time")


def test_schedule_text():
    assert schedule_text(["F_ck(1)", "B(1)"]) == "F_ck(1) B(1)"


def test_with_current_leaves_the_shared_base_alone():
    points = pd.DataFrame({"algorithm": ["store_all"], "budget_bytes": [100], "peak_bytes": [100],
                           "makespan_ms": [10.0], "params": ["{}"]})
    base = pareto_base(points, [40, 100], [20.0, 10.0])
    before = (len(base["data"]), dict(base["layout"]))
    first = with_current(base, current=(40, 20.0), budget_bytes=45)
    second = with_current(base, current=(100, 10.0), budget_bytes=120)
    assert (len(base["data"]), base["layout"]) == before and "shapes" not in base["layout"]
    assert go.Figure(first).layout.annotations[-1].x == 40 and go.Figure(second).layout.annotations[-1].x == 100
    assert go.Figure(second).layout.shapes[0].x0 == 120


def _offload_prediction() -> pd.DataFrame:
    """The simulator's frame of a small offload schedule (a-bar^1 goes to the host and comes back)."""
    from planner.model.chain import Chain, Stage
    from planner.model.schedule import Op, OpKind
    from planner.model.transfer import TransferCosts
    from planner.simulation.simulator import simulate

    chain = Chain("tiny", 100, (Stage(1.0, 2.0, 10, 30, 11), Stage(3.0, 4.0, 20, 50, 21), Stage(0.5, 0.25, 1, 1, 1)),
                  transfer=TransferCosts(10.0, 5.0, None))
    kinds = ["F_all 1", "OFFLOAD 1", "F_all 2", "F_all 3", "B 3", "PREFETCH 1", "B 2", "B 1"]
    ops = [Op(OpKind(k), int(s)) for k, s in (item.split() for item in kinds)]
    return simulate(chain, ops).to_frame()


def test_offload_schedules_show_their_copies_and_host_memory():
    frame = _offload_prediction()
    fig = go.Figure(schedule_figure(frame, ["a", "b"]))
    bars = {t.name: t for t in fig.data}
    assert list(bars["OFFLOAD"].base) == [1.0] and list(bars["OFFLOAD"].x) == [2.0]  # the copy's span
    assert list(bars["PREFETCH"].base) == [4.75] and list(bars["PREFETCH"].y) == [1]
    assert bars["OFFLOAD"].width == 0.35 and bars["F_all"].width is None
    x, y = predicted_line(frame)
    assert len(x) == 3 * 6  # the six computations only
    memory = go.Figure(memory_figure(frame, budget_bytes=300))
    host = [t for t in memory.data if t.name == "host memory (offloaded)"]
    assert len(host) == 1 and host[0].yaxis == "y2" and max(host[0].y) == 20
    assert memory.layout.yaxis2.overlaying == "y"
    plain = memory_figure(_prediction())
    assert [t["name"] for t in plain["data"]] == ["predicted"] and "yaxis2" not in plain["layout"]


def test_pareto_points_of_offload_say_their_host_memory():
    points = pd.DataFrame({"algorithm": ["rotor", "offload"], "budget_bytes": [100, 100], "peak_bytes": [90, 60],
                           "makespan_ms": [10.0, 9.0], "params": ['{"slots": 500}', '{"host_peak_bytes": 2048}']})
    fig = go.Figure(pareto_base(points, [100], [10.0]))
    labels = {t.name: list(t.customdata) for t in fig.data if t.customdata is not None}
    assert labels["rotor"] == ["90 B"] and labels["offload"] == ["60 B (+ 2.0 KiB on the host)"]


def test_a_cached_pareto_figure_names_its_data_so_the_slider_redraws_only_the_star():
    from dashboard.figures_pareto import with_data_revision

    points = pd.DataFrame({"algorithm": ["store_all", "rotor"], "budget_bytes": [100, 50], "peak_bytes": [100, 50],
                           "makespan_ms": [10.0, 12.5], "params": [{}] * 2})
    base = with_data_revision(pareto_base(points, [50, 100], [12.5, 10.0]))
    again = with_data_revision(pareto_base(points, [50, 100], [12.5, 10.0]))
    other = with_data_revision(pareto_base(points, [40, 100], [14.0, 10.0]))
    assert base["layout"]["datarevision"] == again["layout"]["datarevision"] != other["layout"]["datarevision"]
    first, second = with_current(base, (50, 12.5), 52), with_current(base, (100, 10.0), 101)
    # the traces are the same objects from move to move; only the layout's star and line differ
    assert all(a is b for a, b in zip(first["data"], second["data"]))
    assert first["layout"]["datarevision"] == second["layout"]["datarevision"]
    assert first["layout"]["annotations"] != second["layout"]["annotations"]
