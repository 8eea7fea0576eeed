"""A run still being written, beyond the Overview: the Runs table's row and the Planner follow it.

The Runs table's running rows are summarised again on each tick, reading only the parts written since; the
Planner's model (its chain and Pareto front) is built again only when what it is built from changed, and never
while the slider is dragged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dashboard.planning as planning
import memprof.trace.parts as parts
from dashboard import callbacks as cb
from dashboard import callbacks_planner as cp
from dashboard import ids
from dashboard.data import TraceStore
from dashboard.live import live_switch, live_tick
from dashboard.live_planner import drawn_inputs, is_dragging, planner_refresh
from dashboard.live_runs import LIVE_COLUMNS, live_rows
from memprof.trace.format.writer import TraceWriter
from memprof.trace.liveness import writer_record
from memprof.units import format_bytes
from tests.dashboard.fixtures import Traces, activation_profile, event_rows, iteration_row, layer_rows


def _set_status(run_dir: Path, status: str) -> None:
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "status": status, "writer": writer_record()}))  # this process


def _append(run_dir: Path, iteration: int, detail: bool, scale: int = 1) -> int:
    """One iteration, with its detail (layers and events) or its row only; returns its peak."""
    events = event_rows(iteration, activation_profile(scale), start_ns=iteration * 10**9)
    row = {**iteration_row(iteration, events), "detail": detail}
    writer = TraceWriter(run_dir)
    if detail:
        writer.append("layers", layer_rows(iteration))
        writer.append("events", events)
    writer.append("iterations", [row])
    return int(row["peak_allocated_bytes"])


def _row(rows: list[dict], name: str) -> dict:
    return next(row for row in rows if row["name"] == name)


class _PartReads:
    """Counts, per table, the parts read from disk (the store's part cache misses) while active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: dict[str, int] = {}
        original = parts._read_part

        def counting(path, table, *args):
            self.counts[table] = self.counts.get(table, 0) + 1
            return original(path, table, *args)

        monkeypatch.setattr(parts, "_read_part", counting)


def test_the_runs_table_follows_a_running_run_reading_only_new_parts(traces: Traces, monkeypatch):
    run_dir = traces.root / "mlp"
    _set_status(run_dir, "running")
    store = TraceStore(traces.root)
    rows, selected, _, _ = cb.runs_view(store)
    assert _row(rows, "mlp")["state"] == "running" and _row(rows, "mlp")["iterations"] == 3
    assert live_rows(store, rows) is None  # nothing new: nothing sent
    peak = _append(run_dir, 3, detail=False, scale=9)
    reads = _PartReads(monkeypatch)
    fresh = live_rows(store, rows)
    assert fresh is not None and [r["name"] for r in fresh] == [r["name"] for r in rows]  # the user's order
    mlp = _row(fresh, "mlp")
    assert mlp["iterations"] == 4 and mlp["peak_bytes"] == peak and mlp["peak"] == format_bytes(peak)
    assert reads.counts.get("iterations") == 1  # the new part only; the others came from the part cache
    assert [r for r in fresh if r["name"] != "mlp"] == [r for r in rows if r["name"] != "mlp"]
    assert live_rows(store, fresh) is None
    _set_status(run_dir, "closed")
    closed = live_rows(store, fresh)
    assert _row(closed, "mlp")["state"] == "closed"
    assert live_rows(store, closed) is None  # a closed row is not read again
    assert set(LIVE_COLUMNS) <= set(mlp)


def test_a_listed_running_run_keeps_the_interval_on(traces: Traces):
    _set_status(traces.root / "mlp", "running")
    store = TraceStore(traces.root)
    rows = cb.runs_view(store)[0]
    other = ["ddp/rank=0"]  # closed: alone it would turn the refresh off
    assert live_switch(store, other) is True
    assert live_switch(store, other, rows) is False
    stamp, stop = live_tick(store, other, None, rows)
    assert stamp is not None and stop is False
    assert live_tick(store, other, stamp, rows) == (None, False)
    _set_status(traces.root / "mlp", "closed")
    rows = live_rows(store, rows)
    assert live_switch(store, other, rows) is True and live_tick(store, other, stamp, rows) == (None, True)


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The planner models built (each one DP solve of a Pareto front)."""
    built: list[str] = []
    original = planning.model_of_chain

    def counting(chain, *args, **kwargs):
        built.append(chain.name)
        return original(chain, *args, **kwargs)

    monkeypatch.setattr(planning, "model_of_chain", counting)
    return built


def test_the_planner_is_rebuilt_only_when_its_inputs_change(traces: Traces, builds):
    run_dir, names = traces.root / "mlp", ["mlp"]
    store = TraceStore(traces.root)
    low, high, _, _, value, disabled, _ = cp.planner_bounds(store, names, cp.AUTO)
    assert not disabled and len(builds) == 1
    drawn = drawn_inputs(store, names, cp.AUTO)
    budget = (low + high) / 2

    def refresh(drag: float | None = None, tab: str = ids.TAB_PLANNER, shown: dict | None = None):
        return planner_refresh(store, names, cp.AUTO, tab, budget, budget if drag is None else drag,
                               drawn if shown is None else shown)

    assert refresh() is None  # the same inputs: nothing to redraw
    for iteration in range(3, 8):  # iterations without detail (below the run's peak): the chain cannot change
        _append(run_dir, iteration, detail=False)
        assert refresh() is None
    cp.planner_view(store, names, cp.AUTO, budget)  # a slider release reads the cached front
    assert len(builds) == 1
    _append(run_dir, 8, detail=True)  # a detailed iteration: the costs' medians take it in
    assert refresh(drag=budget + 4096) is None  # dragged: waits
    assert refresh(tab=ids.TAB_OVERVIEW) is None  # another tab: waits, opening the Planner catches up
    assert len(builds) == 1
    found = refresh()
    assert found is not None and len(builds) == 2
    new_low, new_high, _, _, new_value, disabled, message, options, now = found
    assert not disabled and message.startswith(f"Chain {builds[0]}")
    assert new_value == min(max(round(budget), new_low), new_high)  # the user's budget stays, inside the range
    assert [o["value"] for o in options] == [cp.AUTO, "module:features"]
    assert now != drawn and now["run"] == "mlp" and now["container"] is None
    assert refresh(shown=now) is None
    cp.planner_view(store, names, cp.AUTO, new_value)  # what the slider's new value redraws: no build
    assert len(builds) == 2


def test_the_planner_refresh_follows_the_chosen_chain(traces: Traces, builds):
    store = TraceStore(traces.root)
    drawn = drawn_inputs(store, ["mlp"], "module:features")
    assert drawn["container"] == "features"
    assert drawn != drawn_inputs(store, ["mlp"], cp.AUTO)  # another chain was drawn: refreshed
    assert drawn_inputs(store, [], cp.AUTO) is None
    assert drawn_inputs(store, ["corrupt"], cp.AUTO)["inputs"] is None
    assert planner_refresh(store, ["corrupt"], cp.AUTO, ids.TAB_PLANNER, None, None, None) is None
    assert planner_refresh(store, None, cp.AUTO, ids.TAB_PLANNER, None, None, None) is None
    assert builds == []


def test_a_drag_is_told_from_a_released_slider():
    assert not is_dragging(None, None) and not is_dragging(1e7, None) and not is_dragging(None, 5.0)
    assert not is_dragging(12_345_678.0, 12_345_678.0)
    assert not is_dragging(12_345_678, 12_345_678.000001)  # the same position, through JSON
    assert is_dragging(12_345_678, 12_000_000)
