"""The dashboard on an estimate's trace: listed as an estimate, and every view reads it as a measured run's."""

from __future__ import annotations

import numpy as np

from dashboard import callbacks as cb
from dashboard import callbacks_planner as cp
from dashboard.data import TraceStore
from memprof import estimate
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes
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


def test_an_estimate_beside_a_measured_run_says_how_far_it_was_by_category(tmp_path):
    import pandas as pd
    import torch

    from dashboard.estimates import estimate_vs_measured
    from memprof import MemoryProfiler

    torch.manual_seed(0)
    model, batch, loss_fn = CASES["mlp"].build()
    found = estimate(model, batch, loss_fn, OPTIMIZERS["adamw"], out_dir=tmp_path, run_id="mlp-estimate")
    optimizer = OPTIMIZERS["adamw"](list(model.parameters()))
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="mlp-measured", print_period=0,
                        background=False) as profiler:
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model, batch).backward()
            optimizer.step()
            profiler.record_stats()
    store = TraceStore(tmp_path)
    for names in (["mlp-measured", "mlp-estimate"], ["mlp-estimate", "mlp-measured"]):
        text = cb.overview_view(store, names)[0]
        assert "Estimated step peak " in text and "at the peaks:" in text
    measured = store.iterations("mlp-measured")
    sentence = estimate_vs_measured(store.iterations("mlp-estimate"), measured)
    peak = int(measured["peak_allocated_bytes"].max())
    error = (peak - found.peak_bytes) / found.peak_bytes
    assert sentence.startswith(f"Estimated step peak {format_bytes(found.peak_bytes)}, measured {format_bytes(peak)} "
                               f"({error:+.2%})")
    assert abs(error) < 0.03
    # a category that differs is named with both sizes and the difference
    shifted = measured.assign(weights=measured["weights"] + 1024)
    assert "weights " in estimate_vs_measured(store.iterations("mlp-estimate"), shifted)
    assert "(+1.0 KiB)" in estimate_vs_measured(store.iterations("mlp-estimate"), shifted)
    assert estimate_vs_measured(pd.DataFrame(), measured) == ""
    # two measured runs: no estimate sentence
    assert "Estimated" not in cb.overview_view(store, ["mlp-measured", "mlp-measured"])[0]

