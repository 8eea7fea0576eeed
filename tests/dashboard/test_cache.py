"""The bounded cache: least recently used values go first, by count and by bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard.cache import BoundedCache


def test_evicts_least_recently_used_by_count():
    cache = BoundedCache(max_entries=2)
    built = []
    for key in ("a", "b", "a", "c", "b"):
        cache.get_or_build(key, lambda key=key: built.append(key) or key.upper())
    # "a" was used again before "c" arrived, so "b" went first and had to be rebuilt.
    assert built == ["a", "b", "c", "b"]
    assert len(cache) == 2


def test_evicts_by_bytes_and_skips_oversized_values():
    frame = pd.DataFrame({"x": np.zeros(1000, dtype=np.int64)})  # 8000 bytes of data
    size = int(frame.memory_usage(index=True).sum())
    cache = BoundedCache(max_entries=10, max_bytes=2 * size + 10)
    for key in range(3):
        cache.get_or_build(key, frame.copy)
    assert len(cache) == 2 and cache.size_bytes == 2 * size
    big = pd.DataFrame({"x": np.zeros(10_000, dtype=np.int64)})
    assert cache.get_or_build("big", lambda: big) is big
    assert len(cache) == 2  # too big to keep


def test_bad_bounds_refused():
    with pytest.raises(ValueError, match="max_entries=0"):
        BoundedCache(max_entries=0)
