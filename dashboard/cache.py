"""A bounded, thread-safe least-recently-used cache for read-only values (frames, fronts).

It is the only state the dashboard keeps between requests. Keys include each run's modification
stamp, so a rewritten run is read again; values are shared between browser sessions and must never
be modified by their users.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import pandas as pd

T = TypeVar("T")


def _size_bytes(value: Any) -> int:
    if isinstance(value, pd.DataFrame):
        return int(value.memory_usage(index=True, deep=False).sum())
    size = getattr(value, "nbytes", None)
    return int(size) if isinstance(size, int) else 0


class BoundedCache:
    """Least-recently-used cache bounded by entry count and by the bytes of the frames it holds.

    Args:
        max_entries: the most values kept.
        max_bytes: the most bytes of data frames (and arrays) kept; one value larger than this is
            returned but not kept.
    """

    def __init__(self, max_entries: int = 64, max_bytes: int = 1 << 30) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"cache bounds must be >= 1, found max_entries={max_entries}, max_bytes={max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def get_or_build(self, key: Hashable, build: Callable[[], T]) -> T:
        """Returns the value cached under ``key``, building and keeping it on a miss.

        ``build`` runs outside the lock, so a slow build does not block other requests; two requests
        missing the same key at once both build it, and the later result is kept.
        """
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        value = build()
        size = _size_bytes(value)
        if size > self.max_bytes:
            return value
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped
        return value

    def clear(self) -> None:
        """Forgets every value."""
        with self._lock:
            self._items.clear()
            self._bytes = 0
