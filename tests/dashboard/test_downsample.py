"""Min/max downsampling: bounded point count, the peak and every bucket's extremes kept."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dashboard.downsample import MIN_POINTS, minmax_indices, visible_slice


def test_small_series_is_returned_whole():
    y = np.array([3, 1, 4, 1, 5])
    assert minmax_indices(y, 8).tolist() == [0, 1, 2, 3, 4]


def test_million_points_capped_and_peak_kept():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 1000, size=1_000_000)
    y[777_777] = 10_000
    y[123_456] = -5
    idx = minmax_indices(y, 2000)
    assert len(idx) <= 2000
    assert 777_777 in idx and 123_456 in idx
    assert idx[0] == 0 and idx[-1] == len(y) - 1
    assert np.all(np.diff(idx) > 0)


def test_each_bucket_keeps_its_extremes():
    y = np.array([0, 9, 1, 2, 8, 3, 7, 7, 5, 6, 4, 0], dtype=float)
    # max_points 8 -> 3 buckets of 4 events: [0 9 1 2] [8 3 7 7] [5 6 4 0].
    idx = minmax_indices(y, 8)
    # bucket minima at 0, 5, 11; maxima at 1, 4, 9; plus the first and last event.
    assert idx.tolist() == [0, 1, 4, 5, 9, 11]


def test_range_limits_the_selection():
    y = np.arange(100, dtype=float)
    idx = minmax_indices(y, 8, start=10, stop=50)
    assert idx.min() == 10 and idx.max() == 49 and len(idx) <= 8


def test_visible_slice_adds_one_neighbour_each_side():
    x = np.arange(0.0, 10.0)
    assert visible_slice(x, 2.5, 5.5) == (2, 7)
    assert visible_slice(x, None, None) == (0, 10)
    assert visible_slice(x, -5, 100) == (0, 10)


def test_too_few_points_refused():
    with pytest.raises(ValueError, match="at least 8"):
        minmax_indices(np.arange(100), MIN_POINTS - 1)
    with pytest.raises(ValueError, match="start <= stop"):
        minmax_indices(np.arange(10), 8, start=5, stop=2)


@settings(max_examples=60, deadline=None)
@given(y=arrays(np.int64, st.integers(1, 3000), elements=st.integers(-10**12, 10**12)),
       max_points=st.integers(MIN_POINTS, 500))
def test_property_cap_extremes_and_order(y, max_points):
    idx = minmax_indices(y, max_points)
    assert len(idx) <= max_points
    assert np.all(np.diff(idx) > 0)
    assert y[idx].max() == y.max() and y[idx].min() == y.min()
    assert idx[0] == 0 and idx[-1] == len(y) - 1
