"""Overview figures: the values plotted are the data, and a long run is decimated without losing a peak."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard.figures_overview import (
    BAR_MAX_ITERATIONS,
    DETAIL_NAME,
    OVERVIEW_MAX_POINTS,
    breakdown_figure,
    decimate,
    peaks_figure,
)
from memprof.categories import CATEGORY_COLUMNS
from tests.dashboard.long_run import activation_peaks


def _iterations(peaks, reserved, **cats):
    frame = pd.DataFrame({"iteration": range(len(peaks)), "peak_allocated_bytes": peaks,
                          "peak_reserved_bytes": reserved})
    for c in CATEGORY_COLUMNS:
        frame[c] = cats.get(c, [0] * len(peaks))
    return frame


@pytest.fixture(scope="module")
def long_frame() -> pd.DataFrame:
    """100,000 iterations: a wave with noise, a spike at 40,013 and the run's peak at 60,007."""
    activations = activation_peaks(100_000, peak_iteration=60_007, detailed_spike=40_013)
    weights = np.full(len(activations), 1 << 26)
    return _iterations(activations + weights, (activations + weights) * 5 // 4, weights=weights,
                       feature_maps=activations)


def test_peaks_figure_plots_the_table(store):
    iterations = store.iterations("mlp")
    fig = peaks_figure(iterations)
    allocated, reserved = fig.data
    assert list(allocated.y) == iterations["peak_allocated_bytes"].tolist()
    assert list(reserved.y) == iterations["peak_reserved_bytes"].tolist()
    assert list(allocated.x) == [0, 1, 2]
    assert allocated.mode == "lines+markers"


def test_peaks_figure_marks_a_compiled_runs_costing_iterations(store):
    iterations = store.iterations("mlp")
    fig = peaks_figure(iterations, costing=[1])
    marks = [t for t in fig.data if t.name == "costing iteration"]
    assert len(marks) == 1 and list(marks[0].x) == [1]
    assert list(marks[0].y) == [int(iterations.set_index("iteration").peak_allocated_bytes[1])]
    assert "not the compiled model as it runs" in marks[0].hovertemplate
    assert not [t for t in peaks_figure(iterations).data if t.name == "costing iteration"]


def test_peaks_figure_compares_two_runs(store):
    a, b = store.iterations("mlp"), store.iterations("ddp/rank=0")
    fig = peaks_figure(a, b, ("mlp", "<i>b</i>"))
    assert len(fig.data) == 4
    assert list(fig.data[2].y) == b["peak_allocated_bytes"].tolist()
    assert "&lt;i&gt;b&lt;/i&gt;" in fig.data[2].name


def test_breakdown_stacks_categories_and_cache():
    frame = _iterations([1000, 3000], [4096, 4096], weights=[600, 600], feature_maps=[400, 2400])
    fig = breakdown_figure(frame)
    by_name = {t.name: list(t.y) for t in fig.data}
    assert by_name["weights"] == [600, 600]
    assert by_name["feature_maps"] == [400, 2400]
    assert by_name["cache (reserved, unallocated)"] == [3096, 1096]
    assert fig.layout.barmode == "stack" and {t.type for t in fig.data} == {"bar"}


def test_nothing_reserved_is_not_drawn():
    frame = _iterations([1000, 3000], [0, 0], weights=[1000, 3000])
    assert [t.name for t in peaks_figure(frame).data] == ["peak allocated"]
    assert "cache (reserved, unallocated)" not in [t.name for t in breakdown_figure(frame).data]


def test_decimate_keeps_all_that_fit_and_the_extremes_of_the_rest():
    assert decimate(np.arange(10), 10).tolist() == list(range(10))
    values = np.sin(np.arange(10_000) / 7.0)
    values[1234] = 5.0
    kept = decimate(values, 100)
    assert len(kept) <= 100 and 1234 in kept and int(np.argmin(values)) in kept


def test_long_run_peaks_are_bounded_and_keep_the_highest(long_frame):
    detail = np.unique([*range(10), *range(100, 100_000, 100), 40_013])
    fig = peaks_figure(long_frame, detail=detail)
    lines = [t for t in fig.data if t.name != DETAIL_NAME]
    assert [t.name for t in lines] == ["peak allocated", "peak reserved"]
    for trace, column in zip(lines, ("peak_allocated_bytes", "peak_reserved_bytes")):
        assert len(trace.x) <= OVERVIEW_MAX_POINTS and trace.mode == "lines"
        assert max(trace.y) == long_frame[column].max()  # the run's peak survives decimation
        assert 60_007 in list(trace.x)
        assert min(trace.y) == long_frame[column].min()
        assert len(trace.customdata) == len(trace.x)
    assert "100,000 iterations" in fig.layout.title.text


def test_long_run_marks_the_detailed_iterations(long_frame):
    detail = np.unique([*range(10), *range(100, 100_000, 100), 40_013])
    markers = next(t for t in peaks_figure(long_frame, detail=detail).data if t.name == DETAIL_NAME)
    assert markers.mode == "markers"
    assert list(markers.x) == detail.tolist()
    assert list(markers.y) == long_frame["peak_allocated_bytes"].to_numpy()[detail].tolist()


def test_too_many_detailed_iterations_are_decimated_too(long_frame):
    detail = np.arange(0, 100_000, 2)
    markers = next(t for t in peaks_figure(long_frame, detail=detail).data if t.name == DETAIL_NAME)
    assert len(markers.x) <= OVERVIEW_MAX_POINTS and set(markers.x) <= set(detail.tolist())
    assert max(markers.y) == long_frame["peak_allocated_bytes"].to_numpy()[detail].max()


def test_every_iteration_detailed_marks_every_point(store):
    iterations = store.iterations("mlp")
    fig = peaks_figure(iterations, detail=iterations["iteration"].to_numpy())
    assert DETAIL_NAME not in [t.name for t in fig.data]
    assert fig.data[0].mode == "lines+markers"
    partial = peaks_figure(iterations, detail=np.array([0, 2]))
    assert [t.name for t in partial.data][-1] == DETAIL_NAME and partial.data[0].mode == "lines"


def test_long_breakdown_is_stacked_areas_summing_to_the_total(long_frame):
    fig = breakdown_figure(long_frame)
    assert {t.type for t in fig.data} == {"scatter"} and {t.stackgroup for t in fig.data} == {"peak"}
    xs = [list(t.x) for t in fig.data]
    assert all(x == xs[0] for x in xs) and len(xs[0]) <= OVERVIEW_MAX_POINTS
    stacked = np.sum([np.asarray(t.y) for t in fig.data], axis=0)
    expected = long_frame["peak_reserved_bytes"].to_numpy()[xs[0]]  # categories + cache = reserved here
    assert stacked.tolist() == expected.tolist()
    assert stacked.max() == long_frame["peak_reserved_bytes"].max()
    assert "100,000 iterations" in fig.layout.title.text


def test_breakdown_switches_to_areas_above_the_bar_limit():
    n = BAR_MAX_ITERATIONS + 1
    frame = _iterations([1000] * n, [0] * n, weights=[1000] * n)
    fig = breakdown_figure(frame)
    assert {t.type for t in fig.data} == {"scatter"} and len(fig.data[0].x) == n
    assert "iterations (each point" not in fig.layout.title.text  # all drawn: nothing decimated


def test_two_compared_runs_have_distinct_colours(store):
    a, b = store.iterations("mlp"), store.iterations("ddp/rank=0")
    fig = peaks_figure(a, b, ("mlp", "ddp/rank=0"))
    colours = {t.name: t.line.color for t in fig.data}
    first = [c for n, c in colours.items() if n.endswith("(mlp)")]
    second = [c for n, c in colours.items() if n.endswith("(ddp/rank=0)")]
    assert first and second and not set(first) & set(second)
    assert fig.layout.yaxis.title.text.startswith("peak memory (")
