"""The timeline figure: stacked categories equal to the data, phases shaded, peak marked, downsampled."""

from __future__ import annotations

import numpy as np
import pytest

from dashboard.figures_timeline import find_peak, phase_spans, relayout_range, timeline_figure
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes
from tests.dashboard.fixtures import HTML_NAME, TRANSIENT_BYTES, write_big_events


def _by_name(fig):
    return {t.name: t for t in fig.data}


def _peak_note(fig):
    notes = [a.text for a in fig.layout.annotations if a.text.startswith("peak ")]
    assert len(notes) == 1
    return notes[0]


def test_small_timeline_plots_every_event(store):
    frame = store.timeline("mlp", 0)
    fig = timeline_figure(frame)
    traces = _by_name(fig)
    for column in CATEGORY_COLUMNS:
        assert list(traces[column].y) == frame[column].tolist()
        assert traces[column].stackgroup == "allocated"
    stacked = sum(np.asarray(traces[c].y) for c in CATEGORY_COLUMNS)
    assert stacked.tolist() == frame["allocated_bytes"].tolist()
    assert list(traces["reserved"].y) == frame["reserved_bytes"].tolist()


def test_phases_shaded_and_peak_marked_with_module(store):
    frame = store.timeline("mlp", 0)
    spans = phase_spans(frame)
    assert [s[0] for s in spans] == ["other", "forward", "backward", "optimizer", "other"]
    # forward runs from its first event (0.1 ms, after "other start") to the first backward event.
    first_backward = frame.loc[frame["phase"] == "backward", "time_ms"].iloc[0]
    assert spans[1][1:] == (0.1, first_backward)
    assert spans[-1][2] == frame["time_ms"].iloc[-1]
    fig = timeline_figure(frame)
    assert len(fig.layout.shapes) == 5
    peak = find_peak(frame)
    assert peak.peak_bytes == frame["allocated_bytes"].max() + TRANSIENT_BYTES
    # Backward of features.4 frees 1,280 B of output and entering features.3 adds its 8 KiB gradient:
    # the highest event is the backward entry of features.3.
    assert peak.phase == "backward" and peak.module == "features.3"
    marker = _by_name(fig)["peak"]
    assert list(marker.y) == [peak.peak_bytes]
    assert _peak_note(fig) == f"peak {format_bytes(peak.peak_bytes)} in features.3 (backward)"
    assert sorted(a.text for a in fig.layout.annotations if not a.text.startswith("peak")) == [
        "backward", "forward", "optimizer"]


def test_peak_attributed_by_the_profiler_wins(store):
    frame = store.timeline("mlp", 0)
    fig = timeline_figure(frame, peak_at=("features.0", "forward"))
    assert _peak_note(fig).endswith("in features.0 (forward)")
    assert list(_by_name(fig)["peak"].y) == [find_peak(frame).peak_bytes]


def test_peak_module_is_escaped(store):
    frame = store.timeline("mlp", 0).copy()
    frame["module"] = HTML_NAME
    fig = timeline_figure(frame)
    assert "<img" not in _peak_note(fig)
    assert "&lt;img" in _peak_note(fig)


@pytest.fixture(scope="module")
def big_frame(tmp_path_factory):
    from dashboard.data import TraceStore

    root = tmp_path_factory.mktemp("big")
    write_big_events(root / "big", 200_000)
    return TraceStore(root).timeline("big", 0)


def test_large_timeline_is_capped_and_keeps_the_spike(big_frame):
    fig = timeline_figure(big_frame, max_points=1000)
    allocated_top = sum(np.asarray(t.y) for t in fig.data if t.name in CATEGORY_COLUMNS)
    assert len(fig.data[0].x) <= 1000
    assert allocated_top.max() == big_frame["allocated_bytes"].max()
    assert find_peak(big_frame).module == "features.spike"


def test_zoom_rebuckets_the_visible_range(big_frame):
    times = big_frame["time_ms"].to_numpy()
    lo, hi = float(times[50_000]), float(times[60_000])
    fig = timeline_figure(big_frame, x_range=(lo, hi), max_points=1000)
    x = np.asarray(fig.data[0].x)
    assert len(x) <= 1000
    inside = x[(x >= lo) & (x <= hi)]
    assert len(inside) >= len(x) - 2  # at most one neighbour each side
    assert list(fig.layout.xaxis.range) == [lo, hi]
    # A zoomed view draws the range's own extremes, not the whole iteration's.
    window = big_frame["allocated_bytes"].to_numpy()[50_000:60_001]
    drawn = sum(np.asarray(t.y) for t in fig.data if t.name in CATEGORY_COLUMNS)
    assert drawn.max() >= window.max() and drawn.min() <= window.min()


@pytest.mark.parametrize(("event", "expected"), [
    ({"xaxis.range[0]": 1.5, "xaxis.range[1]": 3}, (1.5, 3.0)),
    ({"xaxis.range": [0, 2]}, (0.0, 2.0)),
    ({"xaxis.autorange": True}, None),
    ({"yaxis.range[0]": 1, "yaxis.range[1]": 2}, None),
    ({"xaxis.range[0]": 5, "xaxis.range[1]": 1}, None),
    ({"xaxis.range[0]": "a", "xaxis.range[1]": 1}, None),
    (None, None),
])
def test_relayout_range(event, expected):
    assert relayout_range(event) == expected


def test_one_hover_per_point_says_time_phase_module_total_and_categories(store):
    frame = store.timeline("mlp", 0)
    fig = timeline_figure(frame)
    traces = _by_name(fig)
    # the categories draw the stack as steps and stay silent; the total's invisible line carries the one hover
    for column in CATEGORY_COLUMNS:
        assert traces[column].hoverinfo == "skip" and traces[column].line.shape == "hv"
    total = traces["allocated"]
    assert list(total.y) == frame["allocated_bytes"].tolist() and total.showlegend is False
    row = frame.iloc[5]
    text = total.hovertext[5]
    assert text.startswith(f"{row['time_ms']:.3f} ms, {row['phase']}, ")
    assert f"allocated {format_bytes(int(row['allocated_bytes']))}" in text
    for column in CATEGORY_COLUMNS:
        if int(row[column]):
            assert f"{column} {format_bytes(int(row[column]))}" in text
    assert fig.layout.yaxis.title.text.startswith("allocated memory (") and fig.layout.yaxis.automargin


def test_a_compared_run_at_another_speed_is_drawn_on_the_first_runs_clock(store):
    frame = store.timeline("mlp", 0)
    fast = frame.assign(time_ms=frame["time_ms"] / 9.0)  # an estimate: the same events, nine times sooner
    fig = timeline_figure(frame, compare=fast, compare_name="estimate")
    compared = next(t for t in fig.data if str(t.name).startswith("allocated (estimate"))
    assert "aligned at shared events" in compared.name and compared.line.shape == "hv"
    assert list(compared.x) == pytest.approx(frame["time_ms"].tolist())
    assert f"at {float(fast['time_ms'].iloc[3]):.3f} ms of its own" in compared.hovertext[3]
