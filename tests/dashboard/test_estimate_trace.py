"""The dashboard on an estimate's trace: listed as an estimate, and every view reads it as a measured run's."""

from __future__ import annotations

import numpy as np

from dashboard import callbacks as cb
from dashboard import callbacks_planner as cp
from dashboard.data import TraceStore
from memprof import estimate
from memprof.categories import CATEGORY_COLUMNS
from tests.memprof.estimation.cases import CASES, OPTIMIZERS


def test_the_views_read_an_estimate(tmp_path):
    model, batch, loss_fn = CASES["transformer"].build()
    found = estimate(model, batch, loss_fn, OPTIMIZERS["adamw"], out_dir=tmp_path, run_id="tiny-gpt")
    store = TraceStore(tmp_path)
    rows, selected, _, _ = cb.runs_view(store)
    assert [r["kind"] for r in rows] == ["estimate (cpu, fake tensors)"] and selected == [0]
    text, peaks, _ = cb.overview_view(store, ["tiny-gpt"])
    assert text.startswith("Peak ") and max(peaks.data[0].y) == found.peak_bytes
    layer_rows, _ = cb.layers_view(store, ["tiny-gpt"], 1, "weight_bytes")
    assert {"h.0", "h.3"} <= {r["module"] for r in layer_rows}
    figure, _ = cb.timeline_view(store, ["tiny-gpt"], 1)
    stacked = sum(np.asarray(t.y) for t in figure.data if t.name in CATEGORY_COLUMNS)
    assert stacked.tolist() == store.timeline("tiny-gpt", 1)["allocated_bytes"].tolist()
    low, high = cp.planner_bounds(store, ["tiny-gpt"], cp.AUTO)[:2]
    assert low < high == found.peak_bytes  # store-all's budget is the estimated step
