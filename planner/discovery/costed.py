"""Which iterations of a run a chain is built from, and a key that changes exactly when they (or what else the
chain is built from) do.

A chain's structure and the step around it come from the last usable detailed iteration, its costs are medians
over the latest :data:`MEDIAN_ITERATIONS` of them (:mod:`planner.discovery.from_trace`). A run still being
written gains iterations all the time, most without detail; :func:`chain_inputs` lets a caller that keeps a
chain (the dashboard's Planner view) build it again only when a new chain could differ from the one it has.
"""

from __future__ import annotations

import json
from collections.abc import Hashable

from memprof.trace import Trace

#: Costs are medians over at most this many detailed iterations, the latest: enough to smooth timing noise,
#: and a long run's thousand detailed iterations are not all read.
MEDIAN_ITERATIONS = 32
#: The keys of ``meta.json`` that building a chain reads.
META_READ: tuple[str, ...] = ("model", "eager_iterations", "regional_iterations", "compiled_regions",
                               "failure", "selective_overhead_us_per_op", "transfer",
                               "phase_times")


def usable_iterations(trace: Trace) -> list[int]:
    """The detailed iterations a chain is costed from: all but the partial one of a failed run, and of a
    compiled model only its costing iterations (``meta.json``'s ``regional_iterations`` and
    ``eager_iterations``: a compiled iteration runs no module hook, so its layers are empty; see
    :mod:`memprof.capture.eager_pass`)."""
    detailed = trace.detail_iterations
    eager = set(trace.costing_iterations)
    if eager and eager & set(detailed):
        detailed = [i for i in detailed if i in eager]
    failure = trace.meta.get("failure") or {}
    if "iteration" in failure and len(detailed) > 1:
        detailed = [i for i in detailed if i != failure["iteration"]]
    return detailed


def structure_iteration(trace: Trace) -> list[int]:
    """The iteration whose rows give the chain's structure and the step around it: the last usable one whose
    ``layers`` and ``events`` rows are intact (``[]`` when there is no usable iteration).

    A damaged part is found when it is read (a damaged page behind a sound footer): each candidate's events are
    read, latest first, until one is intact. Planned from an iteration whose timeline was lost, the chain would
    silently lose the step around it (chain-only costs).
    """
    usable = usable_iterations(trace)
    for iteration in reversed(usable):
        events = trace.read("events", columns=["iteration", "seq"], iterations=[iteration])
        lost = {i for d in trace.damage if d.table in ("layers", "events") for i in d.iterations}
        if iteration not in lost and not events.empty:
            return [iteration]
    return usable[-1:]


def median_iterations(trace: Trace) -> list[int]:
    """The iterations whose ``layers`` rows give the chain's costs (their medians): the latest usable ones,
    without the first (one-off allocations and warm-up) and without a planning pass's (its forward runs several
    times slower) when there are others."""
    usable = usable_iterations(trace)
    if len(usable) > 1:
        usable = [i for i in usable if i != usable[0]]
    recorded = set(trace.op_iterations)
    if any(i not in recorded for i in usable):
        usable = [i for i in usable if i not in recorded]
    return usable[-MEDIAN_ITERATIONS:]


def chain_inputs(trace: Trace) -> tuple[Hashable, ...]:
    """What :func:`planner.chain_from_trace` reads of ``trace``, as a key: equal keys build equal chains.

    The iterations whose layers give the costs, the one that gives the structure and the step, the last
    detailed one (the weights'), the planning pass's iterations, the damaged parts skipped and the metadata
    read. An iteration without detail changes none of them.
    """
    meta = tuple((key, json.dumps(trace.meta.get(key), sort_keys=True, default=str)) for key in META_READ)
    return (tuple(median_iterations(trace)), tuple(structure_iteration(trace)), tuple(trace.detail_iterations[-1:]),
            tuple(trace.op_iterations), tuple(sorted((d.table, d.part) for d in trace.damage)), meta)
