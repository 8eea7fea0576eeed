"""Callback bodies of the trace views, called directly on the synthetic runs."""

from __future__ import annotations

import json

import plotly.io
import pytest

from dashboard import callbacks as cb
from dashboard.data import TraceStore
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes
from tests.dashboard.fixtures import CHILDREN, HTML_NAME, LAYER_WEIGHT_BYTES, activation_profile


def test_runs_view_lists_every_run_with_errors(store):
    rows, selected, empty, status = cb.runs_view(store)
    assert len(rows) == 6
    errors = {r["name"]: r["error"] for r in rows}
    assert errors["corrupt"] and errors["foreign"]
    assert not errors["mlp"] and not errors["ddp/rank=1"]
    assert empty is None and status == ""
    assert rows[selected[0]]["kind"] == "profiled" and not rows[selected[0]]["error"]


def test_runs_view_of_empty_folder_shows_how_to_start(tmp_path):
    rows, selected, empty, _ = cb.runs_view(TraceStore(tmp_path))
    assert rows == [] and selected == []
    text = json.dumps(empty.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder)
    code = empty.children[2].children  # the lines to paste name the folder served, not a generic traces/
    assert f'profiler = MemoryProfiler(model, optimizer, out_dir="{tmp_path}")' in code
    assert f"writes {tmp_path}/<run>/" in code and "traces/" not in code.replace(str(tmp_path), "")
    assert "profiler.record_stats()" in text


def test_url_selects_a_run_and_refuses_traversal(store):
    rows, selected, _, status = cb.runs_view(store, "?run=ddp/rank=1")
    assert rows[selected[0]]["name"] == "ddp/rank=1" and status == ""
    rows, selected, _, status = cb.runs_view(store, "?run=../../etc")
    assert status.startswith("Refused run '../../etc'")
    assert rows[selected[0]]["name"] != "../../etc"
    _, _, _, status = cb.runs_view(store, "?run=%2Fetc%2Fpasswd")
    assert "Refused run '/etc/passwd'" in status


def test_selected_names_keeps_two_in_order():
    rows = [{"name": n} for n in "abcd"]
    assert cb.selected_names([2, 0, 3], rows) == (["c", "a"], "Showing c, compared with a (only the first two "
                                                               "ticked runs are compared).")
    assert cb.selected_names([], rows) == ([], "No run chosen.")
    assert cb.selected_names([9], rows)[0] == []


def test_overview_view(store):
    text, peaks, breakdown = cb.overview_view(store, ["mlp"])
    iterations = store.iterations("mlp")
    assert text.startswith("Peak ") and "iteration 2" in text
    assert list(peaks.data[0].y) == iterations["peak_allocated_bytes"].tolist()
    assert [t.name for t in breakdown.data][:len(CATEGORY_COLUMNS)] == list(CATEGORY_COLUMNS)


def test_overview_compares_two_runs(store):
    text, peaks, _ = cb.overview_view(store, ["mlp", "ddp/rank=0"])
    a = store.iterations("mlp")["peak_allocated_bytes"].max()
    b = store.iterations("ddp/rank=0")["peak_allocated_bytes"].max()
    assert f"ddp/rank=0 peaks at {b / a:.2f}x of it." in text
    assert len(peaks.data) == 4


@pytest.mark.parametrize("names", [["corrupt"], ["../outside"], ["nope"]])
def test_views_turn_bad_runs_into_messages(store, names):
    """Every view of an unreadable run shows the run's one problem line: no absolute path, no exception name."""
    problem = store.problem(names[0])
    assert problem.startswith(f"Run {names[0]} cannot be opened: ")
    assert str(store.traces_dir) not in problem and "Error" not in problem
    text, peaks, _ = cb.overview_view(store, names)
    assert text == problem
    rows, tree = cb.layers_view(store, names, 0, "weight_bytes")
    assert rows == [] and tree.layout.annotations[0].text == problem
    fig, note = cb.timeline_view(store, names, 0)
    assert note == problem
    assert cb.iteration_options(store, names) == ([], None)
    assert cb.layers_view(store, names, None, "weight_bytes")[1].layout.annotations[0].text == problem


def test_iteration_options_default_to_the_peak(store):
    options, value = cb.iteration_options(store, ["mlp"])
    assert [o["value"] for o in options] == [0, 1, 2] and value == 2


def test_iteration_options_say_which_are_a_compiled_runs_costing_iterations(store, monkeypatch):
    meta = {**store.meta("mlp"), "compiled": True, "regional_iterations": [1], "eager_iterations": []}
    monkeypatch.setattr(store, "meta", lambda name: meta)
    options, _ = cb.iteration_options(store, ["mlp"])
    labels = {o["value"]: o["label"] for o in options}
    assert labels[1].endswith("; a costing iteration)") and "costing" not in labels[0] + labels[2]


def test_layers_view_rows_are_the_table_and_names_stay_text(store):
    rows, tree = cb.layers_view(store, ["mlp"], 1, "weight_bytes")
    assert [r["module"] for r in rows] == ["(model)", "features", *(f"features.{c}" for c in CHILDREN)]
    html_row = rows[2 + CHILDREN.index(HTML_NAME)]
    assert html_row["module"] == f"features.{HTML_NAME}"  # DataTable cells render text, so kept as typed
    assert html_row["weight_bytes"] == LAYER_WEIGHT_BYTES[2]
    assert tree.data[0].values[0] == sum(LAYER_WEIGHT_BYTES)
    _, by_saved = cb.layers_view(store, ["mlp"], 1, "saved_bytes")
    assert by_saved.layout.title.text == "Module tree sized by saved_bytes"
    _, fallback = cb.layers_view(store, ["mlp"], 1, "__class__")
    assert fallback.layout.title.text == "Module tree sized by weight_bytes"


def test_timeline_view_and_zoom(store):
    fig, note = cb.timeline_view(store, ["mlp"], 0)
    n = len(activation_profile())
    assert note == f"{n:,} of {n:,} events drawn."
    zoom = cb.zoom_state({"xaxis.range[0]": 0.5, "xaxis.range[1]": 0.9}, ["mlp"], 0)
    assert zoom == {"run": "mlp", "iteration": 0, "range": [0.5, 0.9]}
    zoomed, note = cb.timeline_view(store, ["mlp"], 0, zoom)
    assert list(zoomed.layout.xaxis.range) == [0.5, 0.9]
    # Events every 0.1 ms: 0.5 .. 0.9 plus one neighbour each side.
    assert list(zoomed.data[0].x) == pytest.approx([0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert note == f"7 of {n:,} events drawn (the lowest and highest of each bucket of the visible range; zoom in " \
                   "for detail)."
    # A zoom made on another iteration or run does not apply.
    assert len(cb.timeline_view(store, ["mlp"], 1, zoom)[0].data[0].x) == n
    assert len(cb.timeline_view(store, ["ddp/rank=0"], 0, zoom)[0].data[0].x) == n
    reset = cb.zoom_state({"xaxis.autorange": True}, ["mlp"], 0)
    assert reset == {"run": "mlp", "iteration": 0, "range": None}
    assert len(cb.timeline_view(store, ["mlp"], 0, reset)[0].data[0].x) == n


def test_timeline_names_the_profilers_peak_module(store, monkeypatch):
    iterations = store.iterations("mlp").assign(peak_module="features.1", peak_phase="forward")
    monkeypatch.setattr(store, "iterations", lambda name: iterations)
    fig, _ = cb.timeline_view(store, ["mlp"], 1)
    notes = [a.text for a in fig.layout.annotations if a.text.startswith("peak ")]
    assert notes == [f"peak {format_bytes(iterations['peak_allocated_bytes'].iloc[1])} in features.1 (forward)"]


def test_timeline_view_downsamples(store):
    fig, note = cb.timeline_view(store, ["mlp"], 0, max_points=8)
    assert len(fig.data[0].x) <= 8
    assert note.startswith(f"{len(fig.data[0].x):,} of {len(activation_profile()):,} events drawn (the lowest")


def test_timeline_compare_draws_second_run(store):
    fig, _ = cb.timeline_view(store, ["mlp", "ddp/rank=0"], 0)
    assert any(str(t.name).startswith("allocated (ddp/rank=0, ") for t in fig.data)


def test_zoom_state_ignores_events_that_change_no_x_range():
    assert cb.zoom_state({"xaxis.range": [1, 2]}, ["a"], 3) == {"run": "a", "iteration": 3, "range": [1.0, 2.0]}
    assert cb.zoom_state({"yaxis.range[0]": 1, "yaxis.range[1]": 2}, ["a"], 3) is None
    assert cb.zoom_state({"autosize": True}, ["a"], 3) is None
    assert cb.zoom_state(None, ["a"], 3) is None


def _post(client, outputs, inputs, changed):
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
            "changedPropIds": [changed], "state": []}
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200
    return response.get_json()["response"]


def test_server_refuses_traversal_sent_to_a_callback(traces):
    from dashboard import ids
    from dashboard.app import create_app

    client = create_app(traces.root).server.test_client()
    outputs = [(ids.OVERVIEW_HEADLINE, "children"), (ids.OVERVIEW_PEAKS, "figure"), (ids.OVERVIEW_BREAKDOWN, "figure")]
    for name in ("../../etc", "/etc", str(traces.root.parent)):
        reply = _post(client, outputs, [(ids.SELECTED_RUNS, "data", [name]), (ids.LIVE_STAMP, "data", None)],
                      f"{ids.SELECTED_RUNS}.data")
        headline = reply[ids.OVERVIEW_HEADLINE]["children"]
        assert headline.startswith(f"Run {name} cannot be opened:")
        assert "climbs out" in headline or "absolute" in headline
    reply = _post(client, outputs, [(ids.SELECTED_RUNS, "data", ["mlp"]), (ids.LIVE_STAMP, "data", None)],
                  f"{ids.SELECTED_RUNS}.data")
    assert reply[ids.OVERVIEW_HEADLINE]["children"].startswith("Peak ")


def test_overview_shows_the_post_mortem_of_a_failed_run(tmp_path):
    import torch

    from dashboard.cache import BoundedCache
    from dashboard.callbacks import overview_view
    from dashboard.data import TraceStore
    from examples import zoo
    from memprof import MemoryBudgetExceeded, MemoryProfiler

    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    budget = 2 * sum(p.numel() * 4 for p in model.parameters()) + 64 * 1024
    try:
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="oom", print_period=0,
                            budget_bytes=budget) as prof:
            for batch_size in (8, 8, 4096):
                zoo.train_step(model, optimizer, make_batch(batch_size))
                prof.record_stats()
    except MemoryBudgetExceeded:
        pass
    text, _, _ = overview_view(TraceStore(tmp_path, BoundedCache()), ["oom"])
    assert "FAILED in iteration 2" in text and "crossed the budget" in text and "planner:" in text


def test_ranks_view_shows_every_rank_and_the_imbalance(store):
    style, text, fig = cb.ranks_view(store, ["ddp/rank=0"])
    assert style == {"display": "block"}
    peaks = {r: store.iterations(f"ddp/rank={r}")["peak_allocated_bytes"].max() for r in (0, 1)}
    assert peaks[1] > peaks[0]
    assert text.startswith("2 ranks. Rank 1 peaks highest") and f"{peaks[1] / peaks[0]:.2f}x" in text
    assert [t.name for t in fig.data] == ["rank 0", "rank 1"]
    assert fig.data[1].line.width > fig.data[0].line.width  # the highest rank stands out


def test_ranks_view_is_hidden_for_a_single_process_run(store):
    assert cb.ranks_view(store, ["mlp"])[0] == {"display": "none"}
    assert cb.ranks_view(store, None)[0] == {"display": "none"}
