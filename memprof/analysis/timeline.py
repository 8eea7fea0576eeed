"""Per-category live bytes after every allocator change, and the event rows read from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from memprof.analysis.attribution import (
    MODEL_STATE_CODES,
    N_CAT,
    OTHER,
    PHASE_LOSS,
    PHASE_NAMES,
    WEIGHT_GRADS,
    Sweep,
)
from memprof.analysis.console import AFTER_FORWARD_KEY, EARLIER_GRADS_KEY
from memprof.analysis.records import Mark
from memprof.categories import CATEGORY_COLUMNS
from memprof.phases import PHASE_CODES, Phase
from memprof.schema import EVENTS_SCHEMA

_MARK_NAMES: dict[int, tuple[str, str]] = {  # keyed by int, as the marks' kinds arrive
    Mark.FWD_ENTER: (Phase.FORWARD.value, "enter"),
    Mark.FWD_EXIT: (Phase.FORWARD.value, "exit"),
    Mark.BWD_ENTER: (Phase.BACKWARD.value, "enter"),
    Mark.BWD_EXIT: (Phase.BACKWARD.value, "exit"),
    Mark.BWD_END: (Phase.BACKWARD.value, "end"),
    Mark.OPT_ENTER: (Phase.OPTIMIZER.value, "enter"),
    Mark.OPT_EXIT: (Phase.OPTIMIZER.value, "exit"),
}


@dataclass(frozen=True)
class Series:
    """Live bytes after k changes, for k = 0..n (row 0 is the state when the iteration began).

    Attributes:
        per_category: ``(n + 1, categories)`` bytes.
        total: allocated bytes (the sum of the categories).
        activations: total minus model state (weights, buffers, weight grads, optimizer state).
    """

    per_category: np.ndarray
    total: np.ndarray
    activations: np.ndarray


def series(sw: Sweep, use_truth: bool) -> Series:
    """Builds the per-category series of one iteration from its sweep."""
    sizes = np.asarray(sw.sizes, dtype=np.int64)
    cats = np.asarray(sw.categories, dtype=np.int64)
    alloc = np.asarray(sw.alloc_change, dtype=np.int64)
    n = len(sw.change_block)
    per_cat = np.zeros((n + 1, N_CAT), dtype=np.int64)
    carried = alloc < 0
    np.add.at(per_cat[0], cats[carried], sizes[carried])
    if n:
        block = np.asarray(sw.change_block, dtype=np.int64)
        signed = np.asarray(sw.change_sign, dtype=np.int64) * sizes[block]
        per_cat[np.arange(1, n + 1), cats[block]] += signed
    np.cumsum(per_cat, axis=0, out=per_cat)
    if use_truth and n:
        _align_to_truth(per_cat, np.asarray(sw.change_truth, dtype=np.int64))
    total = per_cat.sum(axis=1)
    activations = total - per_cat[:, MODEL_STATE_CODES].sum(axis=1)
    return Series(per_cat, total, activations)


def peak_figures(sw: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """What ``series(sw, use_truth=False)`` says of the peak, without its per-category table: the allocated bytes
    after each change (:attr:`Series.total`) and each category's bytes where they are first highest.

    An iteration that keeps no detail reads the series only there, and the table costs the background worker
    more than the rest of such an iteration.
    """
    sizes = np.asarray(sw.sizes, dtype=np.int64)
    carried = np.asarray(sw.alloc_change, dtype=np.int64) < 0
    block = np.asarray(sw.change_block, dtype=np.int64)
    signed = np.asarray(sw.change_sign, dtype=np.int64) * sizes[block]
    total = np.empty(len(block) + 1, dtype=np.int64)
    total[0] = int(sizes[carried].sum())
    np.cumsum(signed, out=total[1:])
    total[1:] += total[0]
    k = int(np.argmax(total))
    cats = np.asarray(sw.categories, dtype=np.int64)
    at_peak = np.zeros(N_CAT, dtype=np.int64)
    np.add.at(at_peak, cats[carried], sizes[carried])
    np.add.at(at_peak, cats[block[:k]], signed[:k])
    return total, at_peak


def _align_to_truth(per_cat: np.ndarray, truth: np.ndarray) -> None:
    # The allocator's absolute total (CUDA) is the truth; what the hooks could not attribute
    # (blocks allocated before the profiler started) is 'other'.
    known = truth >= 0
    if not known.any():
        return
    attributed = per_cat.sum(axis=1)
    filled = np.where(known, truth, 0)
    # carry the last known truth forward over changes the allocator did not report
    last = np.maximum.accumulate(np.where(known, np.arange(len(truth)), -1))
    first = int(np.argmax(known))
    truth_ext = np.empty(len(truth) + 1, dtype=np.int64)
    truth_ext[1:] = np.where(last >= 0, filled[np.maximum(last, 0)], 0)
    truth_ext[0] = truth[first] - (attributed[first + 1] - attributed[first])
    truth_ext[1: first + 1] = truth_ext[0]
    gap = truth_ext - attributed
    per_cat[:, OTHER] += gap


def event_table(sw: Sweep, s: Series, iteration: int, start_ns: int, end_ns: int,
                module_names: list[str], reserved_bytes: int) -> pa.Table:
    """One row per mark, plus a ``start`` and an ``end`` row, with live bytes per category."""
    times = [start_ns] + [m[0] for m in sw.marks] + [end_ns]
    states = [0] + [m[3] for m in sw.marks] + [len(s.total) - 1]
    names = [("other", "start")] + [_MARK_NAMES[m[1]] for m in sw.marks] + [("other", "end")]
    modules = [""] + [module_names[m[2]] if m[2] >= 0 else "" for m in sw.marks] + [""]
    return timeline_rows(s, iteration, states, times, [p for p, _ in names], modules, [e for _, e in names],
                         reserved_bytes)


def timeline_rows(s: Series, iteration: int, states: Sequence[int], times: Sequence[int], phases: Sequence[str],
                  modules: Sequence[str], events: Sequence[str], reserved_bytes: int | Sequence[int]) -> pa.Table:
    """Rows of the events table read at chosen states of an iteration's series, in the order given.

    The one place where a row's bytes are read from a :class:`Series`: its allocated bytes and categories
    at the state, and the highest allocated (and activation) bytes since the previous row's state.

    Args:
        s: the iteration's series.
        iteration: the iteration's number.
        states: for each row, the index into the series (0: when the iteration began) it shows.
        times, phases, modules, events: each row's ``time_ns``, ``phase``, ``module`` and ``event``.
        reserved_bytes: the allocator's reserved bytes, one value for every row or one per row.
    """
    idx = np.asarray(states, dtype=np.int64)
    reserved = (np.full(len(idx), reserved_bytes, dtype=np.int64) if isinstance(reserved_bytes, int)
                else np.asarray(reserved_bytes, dtype=np.int64))
    columns = {
        "iteration": np.full(len(idx), iteration, dtype=np.int64),
        "seq": np.arange(len(idx), dtype=np.int64),
        "time_ns": np.asarray(times, dtype=np.int64),
        "phase": list(phases),
        "module": list(modules),
        "event": list(events),
        "allocated_bytes": s.total[idx],
        "peak_bytes": _peaks_between(s.total, idx),
        "peak_activation_bytes": _peaks_between(s.activations, idx),
        "reserved_bytes": reserved,
    }
    for code, name in enumerate(CATEGORY_COLUMNS):
        columns[name] = s.per_category[idx, code]
    return pa.Table.from_pydict(columns, schema=EVENTS_SCHEMA)


def _peaks_between(total: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Highest total in (previous row, this row], counting this row's own state.

    Rows come in time order, so ``idx`` never decreases and the windows ``[idx[i-1], idx[i]]`` tile
    the series: one ``maximum.reduceat`` answers them all (the per-row loop in
    :func:`peaks_between_reference` cost the background worker half a millisecond per iteration).
    """
    if len(idx) == 0:
        return np.empty(0, dtype=np.int64)
    if len(idx) > 1 and (idx[1:] < idx[:-1]).any():
        return peaks_between_reference(total, idx)
    peaks = np.empty(len(idx), dtype=np.int64)
    peaks[0] = total[: idx[0] + 1].max()
    if len(idx) > 1:
        # reduceat gives max(total[idx[i]:idx[i+1]]), or total[idx[i]] where the two are equal; the
        # window's own last state is added by the maximum with total[idx[i+1]].
        upto = total[: idx[-1] + 1]
        peaks[1:] = np.maximum(np.maximum.reduceat(upto, idx[:-1]), total[idx[1:]])
    return peaks


def peaks_between_reference(total: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The slow, obvious :func:`_peaks_between`: one slice per row (any order of ``idx``)."""
    peaks = np.empty(len(idx), dtype=np.int64)
    previous = 0
    for i, k in enumerate(idx.tolist()):
        lo = min(previous, k)
        peaks[i] = total[lo: k + 1].max()
        previous = k
    return peaks


def peak_summary(sw: Sweep, s: Series, module_names: list[str]) -> dict[str, object]:
    """The iteration's peak: bytes, categories, phase and module that was running."""
    k = int(np.argmax(s.total))
    return peak_row(sw, s.total, s.per_category[k], module_names)


def peak_row(sw: Sweep, total: np.ndarray, at_peak: np.ndarray, module_names: list[str]) -> dict[str, object]:
    """:func:`peak_summary` from the allocated bytes after each change and the categories at their (first) highest."""
    k = int(np.argmax(total))
    phase, module = (sw.change_phase[k - 1], sw.change_module[k - 1]) if k > 0 else (PHASE_CODES[Phase.OTHER], -1)
    return peak_fields(total, at_peak, int(phase), int(module), module_names)


def peak_fields(total: np.ndarray, at_peak: np.ndarray, phase: int, module: int,
                module_names: list[str]) -> dict[str, object]:
    """The iterations table's peak columns: the peak's bytes and categories, the phase code and module index of the
    change that reached it (``Phase.OTHER``'s code and -1 where none did), the bytes at the end."""
    k = int(np.argmax(total))
    out: dict[str, object] = {
        "peak_allocated_bytes": int(total[k]),
        "peak_phase": PHASE_NAMES[phase].value,
        "peak_module": module_names[module] if module >= 0 else "",
        "allocated_bytes": int(total[-1]),
    }
    for code, name in enumerate(CATEGORY_COLUMNS):
        out[name] = int(at_peak[code])
    return out


def peak_notes(sw: Sweep, total: np.ndarray) -> dict[str, object]:
    """What the console report says of the peak beyond the iterations row (:data:`memprof.analysis.console.
    AFTER_FORWARD_KEY`, :data:`memprof.analysis.console.EARLIER_GRADS_KEY`).

    Args:
        sw: the iteration's sweep.
        total: the allocated bytes after each change (:attr:`Series.total`); the peak is its first highest.
    """
    k = int(np.argmax(total))
    after_forward = k > 0 and int(sw.change_phase[k - 1]) == PHASE_LOSS
    return {AFTER_FORWARD_KEY: after_forward, EARLIER_GRADS_KEY: earlier_grad_bytes(sw, k)}


def earlier_grad_bytes(sw: Sweep, k: int) -> int:
    """Bytes of weight gradients made before the iteration began (the previous step's) that are alive after its
    ``k`` first changes and freed later in it: at the peak, the step's ``zero_grad`` ran after its forward
    (Lightning's loop runs it after ``training_step``), so the old gradients were held beside this step's
    activations.
    """
    free = np.asarray(sw.free_change, dtype=np.int64)  # a block freed by change f >= k is alive after k changes
    held = ((np.asarray(sw.alloc_change, dtype=np.int64) < 0) & (free >= k)
            & (np.asarray(sw.categories, dtype=np.int64) == WEIGHT_GRADS))
    return int(np.asarray(sw.sizes, dtype=np.int64)[held].sum())
