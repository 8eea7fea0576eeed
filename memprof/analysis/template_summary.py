"""The summary of a steady iteration that keeps no detail, straight from its template.

A steady iteration's analysis places its template's marks among its events (:func:`memprof.analysis.template.
apply_template`) as rows of the hooks' shape, and the sweep reads them back. An iteration that keeps no detail
needs only what :func:`memprof.analysis.summary.summarise` reads: the marks' kinds, modules and places, which
are the template's, and the storages seen in a role, most of which the template already names by their
allocation's position. So the summary is taken from the template's arrays: the same :func:`placement` decides
whether the iteration repeats its template (and where it does not, the caller analyses it the usual way, which
says so), and no mark row is built. ``tests/memprof/analysis/test_summary.py`` holds it to the sweep of the
placed marks. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memprof.analysis.marks_walk import MarksCache
from memprof.analysis.records import IterationRecord, LiveBlock, Mark
from memprof.analysis.summary import Sightings, Summary, hook_sightings, summarise, with_frees
from memprof.analysis.summary_memo import SummaryMemo
from memprof.analysis.sweep import in_time_order
from memprof.analysis.template import placement


def template_summary(record: IterationRecord, carried: Sequence[LiveBlock], next_block_id: int,
                     known_modules: Any, cache: MarksCache, memo: SummaryMemo | None = None) -> Summary | None:
    """:func:`memprof.analysis.summary.summary_sweep` of a steady record's placed marks, from its template;
    ``None`` where it does not repeat it, or the summary declines (then the record is analysed the usual way).
    ``memo``: the previous steady record's attribution, reused where nothing it depends on differs
    (:mod:`memprof.analysis.summary_memo`)."""
    template = record.template
    if template is None or record.failed or any(m[1] == Mark.BUCKETS_REBUILT for m in record.marks):
        return None
    events = in_time_order(record.events)
    # one sort of the addresses for both the pairing placement checks and the summary's resolver (the events the
    # summary reads are these unless old storages died among them)
    order = None if record.frees else np.argsort(np.asarray(events.ptr, dtype=np.int64), kind="stable")
    found = placement(template, record, events, order)
    if found is None:
        return None
    plan, count = found.plan, len(events)  # (what it reads of the template alone, worked out once per template)
    real_times = np.asarray(events.time_ns, dtype=np.int64)
    events = with_frees(events, record.frees)
    times = np.asarray(events.time_ns, dtype=np.int64)
    bounds = np.searchsorted(times, found.moments, side="right")  # (the template's, where no old storage died)
    facts = cache.facts(plan.kinds, plan.modules, bounds)
    own = hook_sightings(record.marks, bounds[plan.own_rows], record.observations, times)
    observed = plan.template.observations  # placed at the moment of the event before their place, so among the
    # events of that moment (where several share it)
    moments = np.where(plan.observed_has_before, real_times[plan.observed_before] if count else 0, record.start_ns)
    seen = plan.seen_rows
    sightings = Sightings(
        positions=np.concatenate([own.positions, plan.seen_positions]),
        ptrs=np.concatenate([own.ptrs, found.ptrs[seen], observed[:, 3]]),
        bounds=np.concatenate([own.bounds, bounds[plan.mark_of[seen]], np.searchsorted(times, moments, side="right")]),
        codes=np.concatenate([own.codes, plan.seen_codes]),
        inputs=np.concatenate([own.inputs, np.zeros(len(plan.seen_positions), dtype=bool)]))
    # (the events' pairing is the template's, where no old storage's free is among them: placement checked it)
    return summarise(events, facts, sightings, carried, next_block_id, known_modules,
                     None if record.frees else template.pairing, order, memo.attribute if memo is not None else None)
