"""One clock for two runs: a compared run's events, or a measured run of a schedule, on the reference's time axis.

A run profiled beside another (an estimate and its measured run, two measured runs) or a schedule measured under
the profiler runs at its own speed: the estimate's events are squeezed into a few milliseconds, a measured
schedule runs several times slower than predicted. Their memory shapes can only be read together once their
times are mapped onto one axis. Both mappings here are piecewise linear between *anchors*, moments the two
sides share, and extrapolated at the mean rate beyond the first and last:

- :func:`align_times`: the events both runs recorded, matched by phase, module and occurrence (the k-th event
  of module m in phase p), kept where they occur in the same order.
- :func:`op_anchors`: a schedule's operations found in the measured events (the executor runs each operation
  as a call of its stage's modules, which the profiler records): an ``F`` starts at the first forward event of
  its stage's modules after the previous operation, a ``B`` at the first backward event. The loss stage and
  copies have no events of their own and are not anchors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

#: Operation kinds that run a stage's forward (a recomputation in the backward too).
FORWARD_KINDS = ("F_all", "F_ck", "F_none")


def warp(times_ms: np.ndarray, source_ms: np.ndarray, target_ms: np.ndarray) -> np.ndarray:
    """``times_ms`` on the target clock: linear between anchors ``source_ms -> target_ms``, the mean rate outside.

    Args:
        times_ms: times on the source clock.
        source_ms: the anchors on the source clock, non-decreasing.
        target_ms: the same anchors on the target clock, non-decreasing.
    """
    times = np.asarray(times_ms, dtype=float)
    if len(source_ms) == 0:
        return times
    source, target = np.asarray(source_ms, dtype=float), np.asarray(target_ms, dtype=float)
    span = source[-1] - source[0]
    rate = (target[-1] - target[0]) / span if span > 0 else 1.0
    out = np.interp(times, source, target)
    before, after = times < source[0], times > source[-1]
    out[before] = target[0] + (times[before] - source[0]) * rate
    out[after] = target[-1] + (times[after] - source[-1]) * rate
    return out


def _keys(frame: pd.DataFrame) -> pd.DataFrame:
    keys = pd.DataFrame({"phase": frame["phase"].astype(str).to_numpy(), "module": frame["module"].astype(str).to_numpy(),
                         "time_ms": frame["time_ms"].to_numpy(dtype=float)})
    keys["occurrence"] = keys.groupby(["phase", "module"], sort=False).cumcount()
    keys["position"] = np.arange(len(keys))
    return keys


def align_times(frame: pd.DataFrame, reference: pd.DataFrame, min_anchors: int = 2) -> np.ndarray | None:
    """The times of ``frame``'s events on ``reference``'s clock, or ``None`` when they share too few events.

    Args:
        frame: events with ``time_ms``, ``phase`` and ``module``, in event order (the run to move).
        reference: the same columns, the run whose clock is kept.
        min_anchors: the fewest shared events that make an alignment.
    """
    if frame.empty or reference.empty:
        return None
    matched = _keys(frame).merge(_keys(reference), on=["phase", "module", "occurrence"], suffixes=("", "_ref"))
    matched = matched.sort_values("position", kind="stable")
    order = matched["position_ref"].to_numpy()
    # keep the events that come in the same order in both runs (greedy: each later than every one kept before)
    earlier = np.concatenate(([-1], np.maximum.accumulate(order)[:-1])) if len(order) else order
    kept = matched[order > earlier]
    if len(kept) < min_anchors:
        return None
    return warp(frame["time_ms"].to_numpy(dtype=float), kept["time_ms"].to_numpy(), kept["time_ms_ref"].to_numpy())


def _in_stage(modules: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Which events belong to a stage: its modules or modules inside them."""
    hit = np.zeros(len(modules), dtype=bool)
    for name in names:
        hit |= (modules == name) | np.char.startswith(modules.astype(str), name + ".") if name else np.ones_like(hit)
    return hit


def op_anchors(events: pd.DataFrame, prediction: pd.DataFrame,
               stage_modules: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Where each operation of a schedule starts in its measured events, against where the simulator starts it.

    Args:
        events: one measured iteration's events (``time_ms``, ``phase``, ``module``), in event order.
        prediction: the simulator's frame of the schedule (``kind``, ``stage``, ``start_ms``, ``end_ms``; copies,
            ``stream`` other than ``"compute"``, are skipped).
        stage_modules: the modules of stages 1..L+1 (``Stage.modules``; the loss has none).

    Returns:
        ``(measured_ms, predicted_ms)``: the anchors, both non-decreasing; the last operation's end is one too.
    """
    if "stream" in prediction.columns:
        prediction = prediction[prediction["stream"].to_numpy() == "compute"]
    phases = events["phase"].astype(str).to_numpy()
    modules = events["module"].astype(str).to_numpy()
    times = events["time_ms"].to_numpy(dtype=float)
    found: dict[tuple[int, str], np.ndarray] = {}
    measured, predicted = [], []
    position, last = 0, None
    for kind, stage, start in zip(prediction["kind"].astype(str), prediction["stage"].to_numpy(dtype=int),
                                  prediction["start_ms"].to_numpy(dtype=float)):
        names = stage_modules[stage - 1] if 0 < stage <= len(stage_modules) else ()
        if not names:
            continue
        phase = "forward" if kind.split("[")[0] in FORWARD_KINDS else "backward" if kind == "B" else ""
        if not phase:
            continue
        if (stage, phase) not in found:
            found[(stage, phase)] = np.flatnonzero((phases == phase) & _in_stage(modules, names))
        rows = found[(stage, phase)]
        at = int(np.searchsorted(rows, position))
        if at == len(rows):
            continue
        measured.append(times[rows[at]])
        predicted.append(start)
        position, last = int(rows[at]) + 1, (stage, phase)
    if last is not None and last[1] == "backward" and len(prediction):
        rows = found[last]
        measured.append(times[rows[-1]])  # the last backward event of the last operation's stage: its end
        predicted.append(float(prediction["end_ms"].max()))
    return np.asarray(measured), np.asarray(predicted)
