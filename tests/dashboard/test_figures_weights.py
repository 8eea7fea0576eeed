"""Weight-streaming schedules in the planner's figures: host memory beside the device's, Pareto points."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures_pareto import pareto_base
from dashboard.figures_planner import ALGORITHM_COLORS, memory_figure, predicted_line
from memprof import load_trace
from planner import chain_from_trace
from planner.fronts.weight_points import STREAMING, streaming_points
from planner.model.chain import Chain, Stage
from planner.model.transfer import TransferCosts
from planner.model.weights import WeightCosts
from planner.simulation.simulator import simulate
from tests.planner import models as M
from tests.planner.model.test_weights import two_stages


def test_a_streamed_schedule_shows_its_weights_host_memory_and_their_visits_to_the_device() -> None:
    chain = two_stages()
    frame = simulate(chain, M.store_all(2), streamed=[1, 2]).to_frame()
    memory = go.Figure(memory_figure(frame, budget_bytes=600))
    host = [t for t in memory.data if t.name == "host memory (offloaded)"]
    assert len(host) == 1 and host[0].yaxis == "y2" and set(host[0].y) == {60}  # parameters and gradients
    x, y = predicted_line(frame)
    assert max(y) == 550  # the device line counts the weights visiting (B(2) with W1 arriving, G2 written)
    plain = go.Figure(memory_figure(simulate(chain, M.store_all(2)).to_frame()))
    assert "yaxis2" not in plain.layout.to_plotly_json()


def test_pareto_points_of_weight_streaming_say_their_host_memory_and_streamed_stages() -> None:
    params = json.dumps({"host_peak_bytes": 4096, "streamed_weights": [1, 3]})
    points = pd.DataFrame({"algorithm": ["rotor", STREAMING], "budget_bytes": [100, 100], "peak_bytes": [90, 40],
                           "makespan_ms": [10.0, 10.5], "params": ['{"slots": 500}', params]})
    fig = go.Figure(pareto_base(points, [100], [10.0], whole_step=True))
    traces = {t.name: t for t in fig.data if t.customdata is not None}
    assert list(traces[STREAMING].customdata) == ["40 B (+ 4.0 KiB on the host, weights of 2 stages streamed)"]
    assert traces[STREAMING].line.color == ALGORITHM_COLORS[STREAMING]


def test_streaming_points_come_from_chains_with_weight_costs_only() -> None:
    chain = chain_from_trace(load_trace("traces/example"))
    rows = streaming_points(chain, sweep=4)
    assert rows and all(row[0] == STREAMING and row[2] <= row[1] for row in rows)
    streamed = [json.loads(row[4])["streamed_weights"] for row in rows]
    assert streamed[0] and not streamed[-1]  # the lowest budget needs streaming, store-all's none
    bare = Chain("bare", 1, (Stage(1.0, 1.0, 1, 1, 1), Stage(1.0, 1.0, 1, 1, 1)), transfer=TransferCosts(1.0, 1.0))
    assert streaming_points(bare) == []
    assert streaming_points(bare.with_weights(WeightCosts((1,), (1,), (0,)))) == []  # no step costs
