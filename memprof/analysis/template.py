"""Marks for iterations that ran without the submodules' hooks: the last hooked iteration's, placed among their
own allocator events.

A training loop repeats itself: once the allocator's events of two hooked iterations agree (the same sizes in
the same order), :mod:`memprof.capture.steady` turns the submodules' hooks off, which are most of what the
profiler costs the training thread. Such a *steady* iteration still records its allocator events and the
model's, the optimizer's and the gradients' own hooks; its record carries a :class:`MarkTemplate` taken from
the hooked iteration it repeats. :func:`apply_template` checks that it does repeat it (the same sizes, and each
free frees the block made at the same position) and gives each of the template's marks the place it had among
the events, its storages the addresses the iteration's own blocks have there. The analysis then runs on those
marks as on hooked ones: the same categories, layers and peaks, byte for byte; only the moments of the
submodules' marks are the events' around them rather than the hooks' own clock.

Torch-free: the background worker and the reader's recovery apply templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from memprof.analysis.records import (
    CAT,
    AllocationEvents,
    IterationRecord,
    Mark,
    MarkRow,
    MarkTemplate,
    ObservationRow,
    Storage,
)
from memprof.analysis.sweep import in_time_order
from memprof.analysis.template_plan import OLDER, ROOT_INPUT, TemplatePlan, plan_of
from memprof.categories import Category

_FORWARD_ENTER = int(Mark.FWD_ENTER)

#: The observations of the hooks a steady iteration goes without (the gradients', the optimizer's state): the
#: template carries them (the others, the model's inputs and autocast's weight copies, it makes itself).
TEMPLATED = frozenset({CAT[Category.WEIGHT_GRADS], CAT[Category.OPTIMIZER_STATE]})


def pairing(ptrs: np.ndarray, sizes: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Per event (in time order), the position among the allocations of the block it makes or frees.

    A free's block is the latest allocation at its address, when nothing freed it since; otherwise (a block
    from before the iteration, an address not alive) -1. Vectorised; :func:`pairing_reference` is the walk.
    ``order``: the events by address, then time, where the caller has sorted them already.
    """
    made = np.asarray(sizes) > 0
    return _pairing(np.asarray(ptrs, dtype=np.int64), made, np.cumsum(made) - 1, order)


def _pairing(ptrs: np.ndarray, made: np.ndarray, position: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """:func:`pairing` from the events' allocation mask and positions (a template's plan holds them)."""
    count = len(ptrs)
    out = np.where(made, position, -1)
    if order is None:
        order = np.argsort(ptrs, kind="stable")  # by address, then time
    by_address, made_sorted = ptrs[order], made[order]
    after_same = np.zeros(count, dtype=bool)
    after_same[1:] = by_address[1:] == by_address[:-1]
    after_made = np.zeros(count, dtype=bool)
    after_made[1:] = made_sorted[:-1]
    frees = np.nonzero(~made_sorted & after_same & after_made)[0]
    out[order[frees]] = position[order[frees - 1]]
    return out


def pairing_reference(ptrs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`pairing` by walking the events with a dictionary of live addresses."""
    walk = _Walk(np.asarray(ptrs).tolist(), np.asarray(sizes).tolist())
    return np.asarray([walk.step(ptr, size) for ptr, size in zip(walk.ptrs, walk.sizes)], dtype=np.int64)


def synthesized(module: int) -> bool:
    """Whether a mark of ``module`` comes from the template in a steady iteration (a submodule's), rather than
    from the hooks that stay on (the model's own, index 0; the optimizer's and backward's end, -1)."""
    return module > 0


class Placed(NamedTuple):
    """A steady iteration's hooks' records, as its hooks would have made them (:func:`apply_template`)."""

    marks: list[MarkRow]
    observations: list[ObservationRow]
    param_grads: dict[int, Storage]


def take_template(record: IterationRecord) -> MarkTemplate | None:
    """The template of a hooked iteration's record; ``None`` where its marks are not in time order."""
    events = in_time_order(record.events)
    times = np.asarray([m[0] for m in record.marks], dtype=np.int64)
    if len(times) > 1 and bool((times[1:] < times[:-1]).any()):
        return None  # a clock that went back: the marks' places among the events are not known
    walk = _Walk(events.ptr.tolist(), events.size_bytes.tolist())
    bounds = np.searchsorted(events.time_ns, times, side="right").tolist()
    # the templated observations by their places (the walk only goes forward: they are looked up between marks)
    observed = sorted((bound, index) for index, bound in enumerate(np.searchsorted(
        events.time_ns, [o[0] for o in record.observations], side="right").tolist())
        if record.observations[index][2] in TEMPLATED)
    observations: list[tuple[int, int, int, int]] = []
    codes: dict[int, int] = {}  # address -> how it was found, for the parameters' gradients

    def observe_through(bound: int) -> None:
        while len(observations) < len(observed) and observed[len(observations)][0] <= bound:
            at, index = observed[len(observations)]
            walk.to(at)
            _, ptr, category, _ = record.observations[index]
            codes[ptr] = walk.alive.get(ptr, OLDER)
            observations.append((at, category, codes[ptr], ptr))

    inputs: dict[int, int] = {}
    rows: list[tuple[int, int, int, int]] = []
    storages: list[tuple[int, int, int]] = []
    for (_, kind, module, payload), bound in zip(record.marks, bounds):
        observe_through(bound)
        walk.to(bound)
        if module == 0 and kind == _FORWARD_ENTER:
            inputs = {ptr: k for k, (ptr, _) in enumerate(payload)}
        for ptr, nbytes in payload:
            found = walk.alive.get(ptr)
            code = found if found is not None else (ROOT_INPUT - inputs[ptr] if ptr in inputs else OLDER)
            storages.append((code, ptr, nbytes))
        rows.append((int(kind), module, bound, len(payload)))
    observe_through(len(events))
    grads = [(index, codes.get(ptr, OLDER), ptr, nbytes) for index, (ptr, nbytes) in record.param_grads.items()]
    walk.to(len(events))  # the gradients no hook saw accumulated, looked up at the iteration's end
    grads += [(index, walk.alive.get(ptr, OLDER), ptr, nbytes) for index, (ptr, nbytes) in record.grads.items()
              if index not in record.param_grads]
    return MarkTemplate(iteration=record.iteration, sizes=np.ascontiguousarray(events.size_bytes, dtype=np.int64),
                        pairing=pairing(events.ptr, events.size_bytes), marks=_rows(rows, 4),
                        storages=_rows(storages, 3), observations=_rows(observations, 4),
                        param_grads=_rows(grads, 4))


def _rows(rows: Sequence[tuple[int, ...]], width: int) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64).reshape(-1, width)


class _Walk:
    """The blocks the iteration's own allocations made that are alive after a given number of its events: a
    free's block is the latest allocation at its address, when nothing freed it since (the rule
    :func:`pairing` vectorises)."""

    def __init__(self, ptrs: list[int], sizes: list[int]) -> None:
        self.ptrs, self.sizes = ptrs, sizes
        self.alive: dict[int, int] = {}  # address -> position among the allocations
        self.made = self.position = 0

    def step(self, ptr: int, size: int) -> int:
        """One event; the position of the block it makes or frees (-1: none of the iteration's)."""
        if size > 0:
            self.alive[ptr] = self.made
            self.made += 1
            return self.made - 1
        return self.alive.pop(ptr, -1)

    def to(self, bound: int) -> None:
        """Walks on through event ``bound - 1``."""
        for ptr, size in zip(self.ptrs[self.position:bound], self.sizes[self.position:bound]):
            self.step(ptr, size)
        self.position = max(self.position, bound)


def same_allocations(template: MarkTemplate, events: AllocationEvents) -> bool:
    """Whether ``events`` have the template's sizes in the same order (the training process's cheap check).

    ``events`` are an allocation stream's, which every stream gives in time order.
    """
    sizes = np.asarray(events.size_bytes)
    if len(sizes) != len(template.sizes):
        return False
    return (sizes if sizes.dtype == np.int64 else sizes.astype(np.int64)).tobytes() == template.sizes_bytes


class Placement(NamedTuple):
    """Where a steady iteration's template marks fall among its own events (:func:`placement`).

    Attributes:
        plan: the template's arrays for these events (the marks placed: all, but for a failed iteration's, those
            before its end; each own mark's index in the record's marks, -1 for a submodule mark).
        moments: each placed mark's moment: an own mark's own, a submodule mark's that of the event before its
            place (or of the mark before it, when later).
        ptrs: the address of each storage of the placed submodule marks (entries of own marks' storages: 0).
    """

    plan: TemplatePlan
    moments: np.ndarray
    ptrs: np.ndarray


def placement(template: MarkTemplate, record: IterationRecord, events: AllocationEvents,
              order: np.ndarray | None = None) -> Placement | None:
    """Places the template's marks among ``events`` (the record's, in time order), or ``None`` where the iteration
    does not repeat the template: other sizes, another pairing of frees with allocations, other own marks, own marks
    elsewhere among the events, no moment left between the events around a mark, or missing model inputs.
    ``order``: the events by address, then time (:func:`pairing`'s), where the caller has sorted them already.
    What it reads of the template alone comes from its plan (:func:`memprof.analysis.template_plan.plan_of`)."""
    count = len(events)
    if count != len(template.sizes) and not (record.failed and count < len(template.sizes)):
        return None
    plan = plan_of(template, count)
    if not (np.array_equal(events.size_bytes, template.sizes[:count])
            and np.array_equal(_pairing(np.asarray(events.ptr, dtype=np.int64), plan.made, plan.position, order),
                               template.pairing[:count])):
        return None
    own_rows, marks = plan.own_rows, record.marks
    if len(own_rows) != len(marks):
        return None
    own_times = np.fromiter((m[0] for m in marks), dtype=np.int64, count=len(marks))
    if not (np.array_equal(np.fromiter((m[1] for m in marks), dtype=np.int64, count=len(marks)), plan.kinds[own_rows])
            and np.array_equal(np.fromiter((m[2] for m in marks), dtype=np.int64, count=len(marks)),
                               plan.modules[own_rows])
            and np.array_equal(np.searchsorted(events.time_ns, own_times, side="right"), plan.bounds[own_rows])):
        return None
    times = np.asarray(events.time_ns, dtype=np.int64)
    before = np.where(plan.has_before, times[plan.before] if count else 0, record.start_ns)
    before[own_rows] = own_times
    moments = np.maximum.accumulate(before) if plan.placed else before
    last = np.concatenate([[0], moments[:-1]])
    if bool((before[own_rows] < last[own_rows]).any()) or (
            count and bool((plan.checked & (moments >= times[plan.after])).any())):
        return None
    ptrs = _storage_ptrs(plan, marks, events)
    return None if ptrs is None else Placement(plan, moments, ptrs)


def _storage_ptrs(plan: TemplatePlan, marks: Sequence[MarkRow], events: AllocationEvents) -> np.ndarray | None:
    """The addresses of the placed submodule marks' storages; ``None`` where a model input is missing."""
    ptrs = plan.storage_ptrs.copy()
    ptrs[plan.found_rows] = np.asarray(events.ptr)[plan.allocations][plan.found_positions]
    for row, enter, k in zip(plan.root_rows.tolist(), plan.root_enters.tolist(), plan.root_inputs.tolist()):
        if enter < 0 or k >= len(marks[enter][3]):  # the k-th storage of the model's latest forward enter
            return None
        ptrs[row] = marks[enter][3][k][0]
    return ptrs


def apply_template(template: MarkTemplate, record: IterationRecord) -> Placed | None:
    """The marks, observations and parameters' gradients a steady iteration's hooks would have made: the
    template's, placed among its events (:func:`placement`), with the record's own.

    The record's own marks (the model's, the optimizer's, backward's end) keep their moments; each submodule
    mark gets the moment of the event before its place (or of the own mark before it, when later), so that it
    falls between the same events, and each templated observation the moment of the event before its place. A
    failed iteration may be a prefix of the template.

    Returns:
        ``None`` where the iteration does not repeat the template (:func:`placement`).
    """
    events = in_time_order(record.events)
    found = placement(template, record, events)
    if found is None:
        return None
    out: list[MarkRow] = []
    nbytes = template.storages[:, 2].tolist()
    ptrs = found.ptrs.tolist()
    start = 0
    for (kind, module, _, width), moment, own in zip(template.marks[:found.plan.placed].tolist(),
                                                     found.moments.tolist(), found.plan.own.tolist()):
        if own >= 0:
            out.append(record.marks[own])
        else:
            out.append((moment, kind, module, list(zip(ptrs[start:start + width], nbytes[start:start + width]))))
        start += width
    times = events.time_ns.tolist()
    made_ptrs = events.ptr[events.size_bytes > 0].tolist()
    count = len(events)
    return Placed(out, [*record.observations, *_observations(template, times, made_ptrs, count, record.start_ns)],
                  {**record.param_grads, **_param_grads(template, made_ptrs)})


def _found(code: int, ptr: int, made_ptrs: list[int]) -> int:
    """The address of a templated storage found as ``code`` (a block's position, or the address itself)."""
    return made_ptrs[code] if 0 <= code < len(made_ptrs) else ptr


def _observations(template: MarkTemplate, times: list[int], made_ptrs: list[int], count: int,
                  start_ns: int) -> list[ObservationRow]:
    return [(times[bound - 1] if bound else start_ns, _found(code, ptr, made_ptrs), category, 0)
            for bound, category, code, ptr in template.observations.tolist() if bound <= count]


def _param_grads(template: MarkTemplate, made_ptrs: list[int]) -> dict[int, Storage]:
    return {index: (_found(code, ptr, made_ptrs), nbytes) for index, code, ptr, nbytes in template.param_grads.tolist()}
