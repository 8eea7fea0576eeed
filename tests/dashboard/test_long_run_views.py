"""The trace views on a long run: 20,000 iterations of which about 200 kept their detail."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dashboard import callbacks as cb
from dashboard import ids, pickers
from dashboard.callbacks_planner import chain_options
from dashboard.data import TraceStore
from dashboard.figures_overview import DETAIL_NAME, OVERVIEW_MAX_POINTS
from memprof.trace.format.writer import write_meta
from tests.dashboard.fixtures import meta
from tests.dashboard.long_run import LongRun, write_long_run

ITERATIONS = 20_000


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LongRun]:
    root = tmp_path_factory.mktemp("long") / "traces"
    # 100 iterations per part: every detailed iteration but the first ten sits in a part of its own
    return root, write_long_run(root / "long", ITERATIONS, every=100, part_iterations=100)


@pytest.fixture
def store(long_run) -> TraceStore:
    return TraceStore(long_run[0])


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    """Counts the Parquet parts the reader opens, by table folder (``layers.parquet`` ...)."""
    counts: Counter = Counter()
    read_table = pq.read_table

    def counting(source, *args, **kwargs):
        counts[Path(source).parent.name] += 1
        return read_table(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", counting)  # the module every part read goes through
    yield counts


def test_the_synthetic_run_is_what_the_tests_assume(long_run):
    run = long_run[1]
    assert 200 <= len(run.detail) <= 220 and run.peak_iteration not in run.detail
    assert run.detailed_spike in run.detail and run.modules == 100


def test_overview_is_bounded_keeps_the_peak_and_marks_the_detail(store, long_run):
    run = long_run[1]
    text, peaks, breakdown = cb.overview_view(store, ["long"])
    iterations = store.iterations("long")
    assert f"at iteration {run.peak_iteration}" in text  # the headline reads the summary: the run's peak
    allocated = peaks.data[0]
    assert len(allocated.x) <= OVERVIEW_MAX_POINTS and max(allocated.y) == iterations["peak_allocated_bytes"].max()
    assert run.peak_iteration in list(allocated.x)
    markers = next(t for t in peaks.data if t.name == DETAIL_NAME)
    assert list(markers.x) == list(run.detail)
    assert all(len(t.x) <= OVERVIEW_MAX_POINTS for t in breakdown.data)


def test_picker_offers_exactly_the_detailed_iterations(store, long_run):
    run = long_run[1]
    options, value = pickers.iteration_options(store, ["long"])
    assert [o["value"] for o in options] == list(run.detail)
    assert value == run.detailed_spike  # the highest detailed peak, not the run's (undetailed) peak
    assert options[0]["label"].startswith("iteration 0 (peak ")
    note = pickers.detail_note(store, ["long"])
    assert note.startswith(f"{len(run.detail):,} of {ITERATIONS:,} iterations have detail")
    assert f"The run's peak, iteration {run.peak_iteration}, has no detail; the highest detailed peak is " \
           f"iteration {run.detailed_spike} (" in note


def test_layers_read_only_the_wanted_iterations_part(store, long_run, opened):
    run = long_run[1]
    store.iterations("long")  # the summary is read once, for every view
    opened.clear()
    rows, tree = cb.layers_view(store, ["long"], run.detailed_spike, "weight_bytes")
    assert len(rows) == run.modules and opened["layers.parquet"] == 1 and opened["events.parquet"] == 0
    assert set(store.layers_at("long", run.detailed_spike)["iteration"]) == {run.detailed_spike}
    assert tree.data[0].type == "treemap"


def test_timeline_reads_only_the_wanted_iterations_part(store, long_run, opened):
    run = long_run[1]
    store.iterations("long")
    opened.clear()
    fig, note = cb.timeline_view(store, ["long"], run.detail[-1])
    assert opened["events.parquet"] == 1 and opened["layers.parquet"] == 0
    n = run.events_per_iteration
    assert note == f"{n:,} of {n:,} events drawn."
    assert set(store.timeline("long", run.detail[-1])["iteration"]) == {run.detail[-1]}


def test_a_click_picks_the_nearest_detailed_iteration(store, long_run):
    run = long_run[1]
    click = {"points": [{"x": run.peak_iteration, "y": 1, "curveNumber": 0}]}
    nearest = min(run.detail, key=lambda i: abs(i - run.peak_iteration))
    assert pickers.nearest_detailed(store, ["long"], click) == nearest
    assert pickers.nearest_detailed(store, ["long"], {"points": [{"x": -50}]}) == 0
    assert pickers.nearest_detailed(store, ["long"], {"points": [{"x": 10**9}]}) == run.detail[-1]
    assert pickers.nearest_detailed(store, ["long"], None) is None
    assert pickers.nearest_detailed(store, ["long"], {"points": [{"x": "a"}]}) is None


def test_a_click_through_the_server_sets_both_pickers(long_run):
    from dashboard.app import create_app

    root, run = long_run
    client = create_app(root).server.test_client()
    outputs = [(ids.LAYERS_ITERATION, "options"), (ids.LAYERS_ITERATION, "value"), (ids.TIMELINE_ITERATION, "options"),
               (ids.TIMELINE_ITERATION, "value"), (ids.OVERVIEW_DETAIL, "children"), (ids.LAYERS_DETAIL, "children"),
               (ids.TIMELINE_DETAIL, "children")]
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": ids.SELECTED_RUNS, "property": "data", "value": ["long"]},
                       {"id": ids.OVERVIEW_PEAKS, "property": "clickData", "value": {"points": [{"x": 4_990}]}},
                       {"id": ids.LIVE_STAMP, "property": "data", "value": None}],
            "changedPropIds": [f"{ids.OVERVIEW_PEAKS}.clickData"],
            "state": [{"id": ids.LAYERS_ITERATION, "property": "value", "value": None},
                      {"id": ids.TIMELINE_ITERATION, "property": "value", "value": None}]}
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200
    reply = response.get_json()["response"]
    assert reply[ids.LAYERS_ITERATION]["value"] == reply[ids.TIMELINE_ITERATION]["value"] == 5_000
    assert ids.LAYERS_ITERATION not in reply or "options" not in reply[ids.LAYERS_ITERATION]  # options kept
    assert "Iteration 5000 is open" in reply[ids.OVERVIEW_DETAIL]["children"]


def test_planner_containers_come_from_one_detailed_iteration(store, opened):
    store.iterations("long")
    opened.clear()
    options, _ = chain_options(store, ["long"])
    assert "module:blocks" in [o["value"] for o in options]
    assert opened["layers.parquet"] == 1


def _as_version_1(run_dir: Path) -> None:
    """Rewrites a run as schema version 1 wrote it: no ``detail`` column, every iteration detailed."""
    for part in (run_dir / "iterations.parquet").glob("part-*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["detail"]), part)
    write_meta(run_dir, meta(run_dir.name, schema_version=1))


def test_a_version_1_trace_offers_every_iteration(traces):
    _as_version_1(traces.root / "mlp")
    store = TraceStore(traces.root)
    options, value = pickers.iteration_options(store, ["mlp"])
    assert [o["value"] for o in options] == [0, 1, 2] and value == 2
    assert pickers.detail_note(store, ["mlp"]) == "All 3 iterations have detail (layers and timeline)."
    _, peaks, _ = cb.overview_view(store, ["mlp"])
    assert DETAIL_NAME not in [t.name for t in peaks.data] and peaks.data[0].mode == "lines+markers"
    assert cb.timeline_view(store, ["mlp"], 1)[1].endswith("events drawn.")


def test_a_run_without_detail_says_so(tmp_path):
    run = tmp_path / "bare"
    write_long_run(run, 300)
    for part in (run / "iterations.parquet").glob("part-*.parquet"):
        table = pq.read_table(part)
        index = table.schema.get_field_index("detail")
        pq.write_table(table.set_column(index, "detail", pa.array([False] * table.num_rows)), part)
    for table in ("layers", "events"):
        for part in (run / f"{table}.parquet").glob("part-*.parquet"):
            part.unlink()
    store = TraceStore(tmp_path)
    assert pickers.iteration_options(store, ["bare"]) == ([], None)
    assert pickers.detail_note(store, ["bare"]).startswith("None of the 300 iterations has detail")
    assert chain_options(store, ["bare"])[0] == [{"label": "auto-detected chain", "value": "auto"}]
