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

from memprof.analysis.attribution import _MARK_ROLES, INPUTS
from memprof.analysis.marks_walk import MarksCache
from memprof.analysis.records import IterationRecord, LiveBlock, Mark
from memprof.analysis.summary import Sightings, Summary, hook_sightings, summarise, with_frees
from memprof.analysis.summary_memo import SummaryMemo
from memprof.analysis.sweep import in_time_order
from memprof.analysis.template import placement

#: The role each mark kind's storages are seen in, where a submodule's mark implies one (its inputs are not).
_ROLE_OF_KIND = np.array([-1 if (role := _MARK_ROLES.get(kind)) is None or role == INPUTS else role
                          for kind in range(len(Mark))], dtype=np.int64)


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
    kinds, modules, widths = template.marks[:, 0], template.marks[:, 1], template.marks[:, 3]
    real_times = np.asarray(events.time_ns, dtype=np.int64)
    events = with_frees(events, record.frees)
    times = np.asarray(events.time_ns, dtype=np.int64)
    bounds = np.searchsorted(times, found.moments, side="right")  # (the template's, where no old storage died)
    facts = cache.facts(kinds, modules, bounds)
    own = hook_sightings(record.marks, bounds[found.own >= 0], record.observations, times)
    mark_of = np.repeat(np.arange(len(widths)), widths)
    roles = np.where(found.own[mark_of] < 0, _ROLE_OF_KIND[kinds[mark_of]], -1)
    seen = np.flatnonzero(roles >= 0)
    codes = template.storages[seen, 0]
    observed = template.observations  # (bound, category, how found, address); none of them inputs
    # placed at the moment of the event before their place, so among the events of that moment (where several share it)
    moments = np.where(observed[:, 0] > 0, real_times[np.maximum(observed[:, 0] - 1, 0)] if len(real_times) else 0,
                       record.start_ns)
    sightings = Sightings(
        positions=np.concatenate([own.positions, np.where(codes >= 0, codes, -1), np.maximum(observed[:, 2], -1)]),
        ptrs=np.concatenate([own.ptrs, found.ptrs[seen], observed[:, 3]]),
        bounds=np.concatenate([own.bounds, bounds[mark_of[seen]], np.searchsorted(times, moments, side="right")]),
        codes=np.concatenate([own.codes, roles[seen], observed[:, 1]]),
        inputs=np.concatenate([own.inputs, np.zeros(len(seen) + len(observed), dtype=bool)]))
    # (the events' pairing is the template's, where no old storage's free is among them: placement checked it)
    return summarise(events, facts, sightings, carried, next_block_id, known_modules,
                     None if record.frees else template.pairing, order, memo.attribute if memo is not None else None)
