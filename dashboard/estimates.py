"""An estimate beside a measured run: the step peaks and the bytes of each category at them.

``memprof.estimate`` writes a trace marked ``estimate: true`` in ``meta.json``; chosen beside a measured run
of the same model (either order), the overview's headline says how far the estimate was, category by
category, at each run's highest step peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes


def is_estimate(meta: Mapping[str, Any]) -> bool:
    """Whether a run's ``meta.json`` says it is an estimate (predicted on fake tensors, not measured)."""
    return bool(meta.get("estimate"))


def _peak_row(iterations: pd.DataFrame) -> pd.Series:
    return iterations.loc[iterations["peak_allocated_bytes"].idxmax()]


def _signed(delta: int) -> str:
    return ("+" if delta >= 0 else "-") + format_bytes(abs(delta))


def estimate_vs_measured(estimate: pd.DataFrame, measured: pd.DataFrame) -> str:
    """One sentence: the measured peak against the estimated one, and each category that differs.

    Args:
        estimate: the estimate's iterations table.
        measured: the measured run's iterations table.

    Returns:
        ``""`` when either table is empty.
    """
    if estimate.empty or measured.empty:
        return ""
    predicted, actual = _peak_row(estimate), _peak_row(measured)
    peak_p, peak_m = int(predicted["peak_allocated_bytes"]), int(actual["peak_allocated_bytes"])
    error = (peak_m - peak_p) / peak_p if peak_p else 0.0
    parts = []
    for name in CATEGORY_COLUMNS:
        p, m = int(predicted.get(name, 0)), int(actual.get(name, 0))
        if p != m:
            parts.append(f"{name} {format_bytes(p)} estimated, {format_bytes(m)} measured ({_signed(m - p)})")
    by_category = "; ".join(parts) if parts else "every category as estimated"
    return (f"Estimated step peak {format_bytes(peak_p)}, measured {format_bytes(peak_m)} ({error:+.2%}); "
            f"at the peaks: {by_category}.")
