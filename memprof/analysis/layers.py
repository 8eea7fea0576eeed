"""Per-module costs of one iteration (the ROTOR paper's u_f, u_b, a, a-bar, o_f, o_b; section 5.1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memprof.analysis.attribution import COMM_BUFFERS, FEATURE, MODEL_STATE_CODES, WEIGHT_COPIES, Call, Sweep
from memprof.analysis.micro_batches import MicroBatches, in_last
from memprof.analysis.records import ModuleInfo
from memprof.analysis.timeline import Series


def _block_arrays(sw: Sweep) -> tuple[np.ndarray, ...]:
    """Blocks sorted by allocation change: (alloc, free, size, activation, feature, weight copy, comm buffer)."""
    alloc = np.asarray(sw.alloc_change, dtype=np.int64)
    order = np.argsort(alloc, kind="stable")
    free = np.asarray(sw.free_change, dtype=np.int64)[order]
    cats = np.asarray(sw.categories, dtype=np.int64)[order]
    return (alloc[order], np.where(free < 0, np.iinfo(np.int64).max, free),
            np.asarray(sw.sizes, dtype=np.int64)[order], ~np.isin(cats, MODEL_STATE_CODES), cats == FEATURE,
            cats == WEIGHT_COPIES, cats == COMM_BUFFERS)


@dataclass(frozen=True)
class CallCosts:
    """Per-call memory figures, one entry per call in the order given.

    Attributes:
        kept: activation bytes allocated during the call and still alive at its end.
        features: feature-map bytes allocated during the call.
        overhead: the call's transient peak of activations above its start and what it kept.
        copies: weight-copy bytes allocated during the call (autocast's saved casts, FSDP's unsharded parameters).
        comms: communication-buffer bytes allocated during the call (FSDP2's all-gather output of its unit).
    """

    kept: list[int]
    features: list[int]
    overhead: list[int]
    copies: list[int]
    comms: list[int]


def call_costs(sw: Sweep, activations: np.ndarray, calls: list[Call]) -> CallCosts:
    """:class:`CallCosts` of ``calls``, all at once.

    A few array operations over every (call, block allocated in it) pair and a range-maximum table
    over the activations replace a dozen small ones per call (:func:`call_costs_reference`), which
    were most of the background worker's time in :func:`layer_rows`.
    """
    if not calls:
        return CallCosts([], [], [], [], [])
    alloc, free, size, activation, feature, copy, comm = _block_arrays(sw)
    starts = np.fromiter((c.start_change for c in calls), dtype=np.int64, count=len(calls))
    ends = np.maximum(np.fromiter((c.end_change for c in calls), dtype=np.int64, count=len(calls)), starts)
    lo, hi = np.searchsorted(alloc, starts), np.searchsorted(alloc, ends)
    counts = hi - lo  # ends >= starts, so never negative
    feature_prefix = np.concatenate(([0], np.cumsum(np.where(feature, size, 0))))
    features = feature_prefix[hi] - feature_prefix[lo]
    copy_prefix = np.concatenate(([0], np.cumsum(np.where(copy, size, 0))))
    copies = copy_prefix[hi] - copy_prefix[lo]
    comm_prefix = np.concatenate(([0], np.cumsum(np.where(comm, size, 0))))
    comms = comm_prefix[hi] - comm_prefix[lo]
    # every (call, block) pair: the block is kept if it is an activation still alive at the call's end
    call_of_pair = np.repeat(np.arange(len(calls)), counts)
    first_pair = np.concatenate(([0], np.cumsum(counts)))
    block_of_pair = np.arange(first_pair[-1]) - np.repeat(first_pair[:-1] - lo, counts)
    kept_bytes = np.where(activation[block_of_pair] & (free[block_of_pair] >= ends[call_of_pair]),
                          size[block_of_pair], 0)
    kept_prefix = np.concatenate(([0], np.cumsum(kept_bytes)))
    kept = kept_prefix[first_pair[1:]] - kept_prefix[first_pair[:-1]]
    highest = _range_max(activations, starts, ends)
    overhead = np.maximum(0, highest - activations[starts] - kept)
    return CallCosts(kept.tolist(), features.tolist(), overhead.tolist(), copies.tolist(), comms.tolist())


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i]:hi[i] + 1]) for every i, from a sparse table (log n levels of pairwise maxima)."""
    levels = [values]
    width = 1
    while 2 * width <= len(values):
        previous = levels[-1]
        levels.append(np.maximum(previous[:-width], previous[width:]))
        width *= 2
    length = hi - lo + 1
    level = np.frexp(length)[1].astype(np.int64) - 1  # floor(log2(length)), exact for integers
    out = np.empty(len(lo), dtype=values.dtype)
    for k in np.unique(level).tolist():  # one gather per level in use, not per call
        chosen = level == k
        table = levels[k]
        out[chosen] = np.maximum(table[lo[chosen]], table[hi[chosen] - (1 << k) + 1])
    return out


def call_costs_reference(sw: Sweep, activations: np.ndarray, calls: list[Call]) -> CallCosts:
    """The slow, obvious :func:`call_costs`: slices per call."""
    alloc, free, size, activation, feature, copy, comm = _block_arrays(sw)
    kept_all, features_all, overhead_all, copies_all, comms_all = [], [], [], [], []
    for call in calls:
        end = max(call.end_change, call.start_change)
        lo, hi = np.searchsorted(alloc, [call.start_change, end])
        alive = (free[lo:hi] >= end) & activation[lo:hi]
        kept = int(size[lo:hi][alive].sum())
        window = activations[call.start_change: end + 1]
        kept_all.append(kept)
        features_all.append(int(size[lo:hi][feature[lo:hi]].sum()))
        copies_all.append(int(size[lo:hi][copy[lo:hi]].sum()))
        comms_all.append(int(size[lo:hi][comm[lo:hi]].sum()))
        overhead_all.append(max(0, int(window.max() - activations[call.start_change] - kept)))
    return CallCosts(kept_all, features_all, overhead_all, copies_all, comms_all)


def layer_rows(sw: Sweep, s: Series, infos: list[ModuleInfo], iteration: int, order: dict[int, int],
               weight_bytes: list[int], weight_grad_bytes: list[int],
               split: MicroBatches | None = None, comm_bytes: int = 0) -> list[dict]:
    """One row per module that ran (or holds weights) in this iteration, as the layers table wants.

    When the iteration accumulated gradients over micro-batches (``split``), the calls are those of the
    last micro-batch (:mod:`memprof.analysis.micro_batches`); weight and gradient bytes are the step's.
    Communication buffers: where a module below the root allocates some in its own forward (FSDP2 gathers a
    unit's parameters into one in the unit's forward), each module gets those its forward calls allocated;
    else ``comm_bytes`` (DDP's gradient buckets, made by the wrapper) is shared out as :func:`comm_shares` says.
    """
    stats: dict[int, dict] = {}
    forward_calls = in_last(sw.forward_calls, split) if split is not None else sw.forward_calls
    backward_calls = in_last(sw.backward_calls, split) if split is not None else sw.backward_calls

    def row(module: int) -> dict:
        if module not in stats:
            stats[module] = {"calls": 0, "forward_ms": 0.0, "backward_ms": 0.0, "saved_bytes": 0,
                             "feature_map_bytes": 0, "weight_copy_bytes": 0, "forward_overhead_bytes": 0,
                             "backward_overhead_bytes": 0,
                             "grad_input_bytes": 0, "input_bytes": 0, "output_bytes": 0,
                             "input_ids": [], "output_ids": []}
        return stats[module]

    forward = call_costs(sw, s.activations, forward_calls)
    gathered: dict[int, int] = {}  # comm bytes each module's forward calls allocated
    for call, kept, features, overhead, copies, comms in zip(forward_calls, forward.kept, forward.features,
                                                             forward.overhead, forward.copies, forward.comms):
        gathered[call.module] = gathered.get(call.module, 0) + comms
        r = row(call.module)
        if r["calls"] == 0:
            r["input_ids"], r["output_ids"] = list(call.inputs), list(call.outputs)
            r["input_bytes"] = call.input_bytes
        r["calls"] += 1
        r["forward_ms"] += (call.end_ns - call.start_ns) / 1e6
        r["saved_bytes"] += kept
        r["feature_map_bytes"] += features
        r["weight_copy_bytes"] += copies
        r["output_bytes"] += call.output_bytes
        r["forward_overhead_bytes"] = max(r["forward_overhead_bytes"], overhead)
    backward = call_costs(sw, s.activations, backward_calls)
    for call, kept, overhead in zip(backward_calls, backward.kept, backward.overhead):
        r = row(call.module)
        r["backward_ms"] += (call.end_ns - call.start_ns) / 1e6
        r["grad_input_bytes"] += kept
        r["backward_overhead_bytes"] = max(r["backward_overhead_bytes"], overhead)
    rows = []
    by_unit = any(comms > 0 for module, comms in gathered.items() if module != 0)
    shares = [gathered.get(m, 0) for m in range(len(infos))] if by_unit else \
        comm_shares(comm_bytes, weight_grad_bytes, weight_bytes)
    for module, info in enumerate(infos):
        if module not in stats and not info.param_indices:
            continue
        r = row(module)
        r.update(
            iteration=iteration, module=info.name,
            parent=infos[info.parent].name if info.parent >= 0 else "",
            depth=info.depth, order=order.get(module, -1), kind=info.kind,
            weight_bytes=weight_bytes[module], weight_grad_bytes=weight_grad_bytes[module],
            buffer_bytes=info.buffer_bytes, comm_buffer_bytes=shares[module],
        )
        rows.append(r)
    return rows


def comm_shares(comm_bytes: int, weight_grad_bytes: list[int], weight_bytes: list[int]) -> list[int]:
    """Each module's part of the communication buffers: DDP's buckets hold one slot per parameter gradient, so
    a module's part is its gradients' share of the root's (its parameters' share when no gradient is held).

    The root (index 0) gets all of it; a module's part is the sum of its children's (up to rounding down).
    """
    sizes = weight_grad_bytes if weight_grad_bytes and weight_grad_bytes[0] > 0 else weight_bytes
    total = sizes[0] if sizes else 0
    if comm_bytes <= 0 or total <= 0:
        return [0] * len(sizes)
    return [comm_bytes * size // total for size in sizes]


def subtree_bytes(infos: list[ModuleInfo], per_param: dict[int, tuple[int, int]]) -> list[int]:
    """Bytes of unique storages among each module's parameters, from ``param index -> (ptr, nbytes)``."""
    out = []
    for info in infos:
        unique = {per_param[i][0]: per_param[i][1] for i in info.param_indices if i in per_param}
        out.append(sum(unique.values()))
    return out
