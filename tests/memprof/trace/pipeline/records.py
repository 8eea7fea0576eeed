"""Records for the journal's and its payloads' tests, and how two of them are compared."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from memprof.analysis.records import AllocationEvents, IterationRecord, Mark, MarkTemplate
from memprof.analysis.template import take_template


def record(iteration: int, n_events: int = 5) -> IterationRecord:
    """A record with random events (every column of its own) and a few rows in each table."""
    rng = np.random.default_rng(iteration)
    events = AllocationEvents(*(rng.integers(0, 1 << 40, n_events) for _ in range(5)))
    return IterationRecord(
        iteration=iteration, epoch=iteration // 3, start_ns=1_000 + iteration, end_ns=2_000 + iteration,
        events=events,
        marks=[(10, Mark.FWD_ENTER, 0, [(0x1000, 64), (0x2000, 32)]), (11, Mark.FWD_EXIT, 0, []),
               (12, Mark.BWD_END, -1, [])],
        observations=[(10, 0x1000, 6, 64), (11, 0x3000, 3, 0)], frees=[(13, 0x1000)],
        param_grads={0: (0x4000, 16)}, grads={0: (0x4000, 16), 2: (0x5000, 8)},
        reserved_bytes=4096, peak_reserved_bytes=8192, failed=iteration == 7)


def same(a: IterationRecord, b: IterationRecord) -> None:
    """Asserts that two records hold the same values."""
    for name in ("time_ns", "ptr", "size_bytes", "total_allocated_bytes", "total_reserved_bytes"):
        np.testing.assert_array_equal(getattr(a.events, name), getattr(b.events, name))
    assert [(t, int(k), m, [tuple(s) for s in p]) for t, k, m, p in a.marks] == \
        [(t, int(k), m, [tuple(s) for s in p]) for t, k, m, p in b.marks]
    assert [tuple(o) for o in a.observations] == [tuple(o) for o in b.observations]
    assert [tuple(f) for f in a.frees] == [tuple(f) for f in b.frees]
    assert (a.param_grads, a.grads) == (b.param_grads, b.grads)
    assert (a.iteration, a.epoch, a.start_ns, a.end_ns, a.reserved_bytes, a.peak_reserved_bytes, a.failed,
            a.detail) == \
        (b.iteration, b.epoch, b.start_ns, b.end_ns, b.reserved_bytes, b.peak_reserved_bytes, b.failed, b.detail)


def template_of(iteration: int) -> MarkTemplate:
    """The template of :func:`record`'s iteration, its events sorted."""

    hooked = record(iteration, 6)
    template = take_template(replace(hooked, events=AllocationEvents(*(np.sort(c) for c in (
        hooked.events.time_ns, hooked.events.ptr, hooked.events.size_bytes, hooked.events.total_allocated_bytes,
        hooked.events.total_reserved_bytes)))))
    assert template is not None
    return template


def same_template(a: MarkTemplate, b: MarkTemplate) -> None:
    """Asserts that two templates hold the same values."""
    assert a.iteration == b.iteration
    for name in ("sizes", "pairing", "marks", "storages", "observations", "param_grads"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
