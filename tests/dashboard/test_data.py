"""Trace access: safe names, runs listed with errors, cached column reads that notice rewrites."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dashboard.data import LAYER_COLUMNS, TIMELINE_COLUMNS, TraceStore, UnsafeRunPathError, resolve_run
from memprof.errors import TraceNotFoundError
from memprof.units import format_bytes
from tests.dashboard.fixtures import CHILDREN, STEP_NS, activation_profile, event_rows, write_profiled_run


@pytest.mark.parametrize("name", ["../outside", "mlp/../../outside", "/etc", "/etc/passwd", "..", ".", "",
                                  "  ", "C:\\Windows", "a\\..\\..\\b", "mlp\x00"])
def test_names_outside_the_folder_are_refused(traces, name):
    (traces.root.parent / "outside").mkdir(exist_ok=True)
    with pytest.raises(UnsafeRunPathError):
        resolve_run(traces.root, name)


def test_symlink_leading_out_is_refused(traces, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, traces.root / "link")
    with pytest.raises(UnsafeRunPathError, match="outside the traces folder"):
        resolve_run(traces.root, "link")


def test_good_names_resolve_and_missing_ones_say_so(traces):
    assert resolve_run(traces.root, "mlp") == (traces.root / "mlp").resolve()
    assert resolve_run(traces.root, "ddp/rank=1") == (traces.root / "ddp" / "rank=1").resolve()
    with pytest.raises(TraceNotFoundError, match="no run named 'nope'"):
        resolve_run(traces.root, "nope")


def test_runs_listed_with_errors_not_raised(store, traces):
    rows = {r["name"]: r for r in (store.summary(e) for e in store.runs())}
    assert set(rows) == {"mlp", "mlp-measured", "corrupt", "foreign", "ddp/rank=0", "ddp/rank=1"}
    assert "not valid JSON" in rows["corrupt"]["error"]
    assert "other-tool" in rows["foreign"]["error"]
    assert rows["mlp"]["iterations"] == 3 and rows["mlp"]["error"] == ""
    assert rows["ddp/rank=1"]["rank"] == "1/2"
    assert rows["mlp-measured"]["kind"] == "measured store_all schedule of mlp"
    # Iteration 2 holds activations 3x larger: its highest event is the run's peak.
    expected = max(r["peak_bytes"] for r in event_rows(2, activation_profile(3)))
    assert rows["mlp"]["peak_bytes"] == expected
    assert rows["mlp"]["peak"] == format_bytes(expected)


def test_missing_folder_lists_nothing(tmp_path):
    assert TraceStore(tmp_path / "absent").runs() == []


def test_broken_table_reported_in_summary(traces):
    part = next((traces.root / "mlp" / "iterations.parquet").glob("part-*.parquet"))
    part.write_bytes(b"PAR1 truncated")
    store = TraceStore(traces.root)
    row = next(store.summary(e) for e in store.runs() if e.name == "mlp")
    assert "not a readable Parquet file" in row["error"]


def test_timeline_reads_one_iteration_in_ms(store):
    frame = store.timeline("mlp", 1)
    assert len(frame) == len(activation_profile())
    assert set(frame["iteration"]) == {1}
    assert frame["time_ms"].iloc[0] == 0.0
    assert np.allclose(np.diff(frame["time_ms"]), STEP_NS / 1e6)
    assert set(TIMELINE_COLUMNS) <= set(frame.columns)
    assert "event" not in frame.columns  # only the columns the view needs are read


def test_layers_at_one_iteration(store):
    layers = store.layers_at("mlp", 2)
    assert list(layers.columns) == list(LAYER_COLUMNS)
    assert list(layers["module"]) == ["", "features", *(f"features.{c}" for c in CHILDREN)]


def test_cache_hits_and_rewrite_invalidates(traces):
    store = TraceStore(traces.root)
    first = store.iterations("mlp")
    assert store.iterations("mlp") is first  # served from the cache
    run_dir: Path = traces.root / "mlp"
    write_profiled_run(run_dir, "mlp", iterations=4, first=3)  # appends 4 more parts
    again = store.iterations("mlp")
    assert again is not first and len(again) == 7


def test_cache_is_bounded(traces):
    from dashboard.cache import BoundedCache

    store = TraceStore(traces.root, BoundedCache(max_entries=3))
    for iteration in range(3):
        store.timeline("mlp", iteration)
    assert len(store.cache) == 3
