"""A profiled run as another, busier or quieter machine would have timed it: every measured time scaled at random.

:func:`retimed` multiplies each row's ``forward_ms`` and ``backward_ms`` (``layers``, the planning pass's ``ops``)
and each event's time since the one before it (``events``) by its own factor drawn from ``[low, high]``, and
likewise every phase time and the selective checkpoint's measured overhead in ``meta.json``; bytes, FLOPs, the
order of events and everything else stay as recorded. What the planner builds from it may differ from the
original only where measured times decide.
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from memprof.trace import Trace

_TIME_COLUMNS = ("forward_ms", "backward_ms", "step_ms")
_PHASE_KEYS = ("host_forward_ms", "host_backward_ms", "forward_ms", "backward_ms")


@dataclasses.dataclass(frozen=True)
class RetimedTrace(Trace):
    """A :class:`memprof.trace.Trace` whose reads return scaled times (see the module's docstring)."""

    seed: int = 0
    low: float = 0.3
    high: float = 3.0

    def read(self, table: str, columns: Sequence[str] | None = None,
             iterations: Iterable[int] | None = None) -> pd.DataFrame:
        frame = super().read(table, columns, iterations)
        if frame.empty:
            return frame
        frame = frame.copy()
        # one generator per table and read: the same rows scale alike whatever else was read before
        rng = np.random.default_rng([self.seed, zlib.crc32(table.encode())])
        for column in _TIME_COLUMNS:
            if column in frame.columns:
                frame[column] = frame[column].to_numpy(dtype=float) * rng.uniform(self.low, self.high, len(frame))
        if "time_ns" in frame.columns:
            keys = [c for c in ("iteration", "seq") if c in frame.columns]
            order = frame.sort_values(keys).index if keys else frame.index
            times = frame.loc[order, "time_ns"].to_numpy(dtype=np.int64)
            steps = np.diff(times, prepend=times[0]) * rng.uniform(self.low, self.high, len(times))
            frame.loc[order, "time_ns"] = times[0] + np.cumsum(steps).astype(np.int64)
        return frame


def retimed(trace: Trace, seed: int, low: float = 0.3, high: float = 3.0) -> RetimedTrace:
    """``trace`` with every measured time scaled by factors drawn from ``[low, high]`` with ``seed``."""
    rng = np.random.default_rng([seed, 1])
    meta = copy.deepcopy(trace.meta)
    for row in (meta.get("phase_times") or {}).get("iterations", []):
        for key in _PHASE_KEYS:
            row[key] = float(row[key]) * float(rng.uniform(low, high))
    if isinstance(meta.get("selective_overhead_us_per_op"), (int, float)):
        meta["selective_overhead_us_per_op"] = float(meta["selective_overhead_us_per_op"]) * float(rng.uniform(low, high))
    fields = {f.name: getattr(trace, f.name) for f in dataclasses.fields(Trace) if f.init}
    return RetimedTrace(**{**fields, "meta": meta}, seed=seed, low=low, high=high)
