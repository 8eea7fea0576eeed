"""What placing a template reads of the template alone, worked out once per template.

Every steady iteration of a run places the same template among its own events (:func:`memprof.analysis.template.
placement`) and summarises it from the template's arrays (:mod:`memprof.analysis.template_summary`). Most of what
those read is the template's: which events allocate, each allocation's position, which marks are the hooks'
own, the event before each mark, which storages a mark's role names and how each is found. A
:class:`TemplatePlan` holds those arrays, so a steady record costs only what depends on its own addresses and
moments; :func:`plan_of` keeps the plans of the last few templates (a run uses one at a time). Torch-free.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from memprof.analysis.attribution import _MARK_ROLES, INPUTS
from memprof.analysis.records import Mark, MarkTemplate

#: A storage found as an address older than the iteration (a parameter, a cached tensor).
OLDER = -1
#: ``ROOT_INPUT - k``: the k-th storage of the model's latest forward-enter mark.
ROOT_INPUT = -2
_FORWARD_ENTER = int(Mark.FWD_ENTER)
#: The role each mark kind's storages are seen in, where a submodule's mark implies one (its inputs are not).
_ROLE_OF_KIND = np.array([-1 if (role := _MARK_ROLES.get(kind)) is None or role == INPUTS else role
                          for kind in range(len(Mark))], dtype=np.int64)
_PLANS_KEPT = 4


@dataclass(frozen=True, eq=False)
class TemplatePlan:
    """A template's arrays for placing its first ``placed`` marks among ``count`` events (all of them, but for a
    failed iteration's prefix). Built by :func:`plan_of`.

    Attributes:
        template: the template.
        count: the events placed among.
        made: per event, whether it allocates.
        position: per event, the position among the allocations of the last allocation up to it.
        allocations: the events that allocate.
        placed: the marks placed.
        kinds, modules, bounds, widths: the placed marks' columns.
        own_rows: the marks the hooks that stay on make (the record's own), in order.
        own: per mark, its index among the record's own marks (-1: a submodule's mark).
        before: per mark, the event before its place (0 where none: ``has_before`` says).
        has_before: per mark, whether an event comes before its place.
        after: per mark, the event after its place (the last where none).
        checked: per mark, whether it is a submodule's with an event after it (which its moment must precede).
        mark_of: per storage of the placed marks, its mark.
        storage_ptrs: the storages' addresses where they are the template's own (own marks' storages: 0).
        found_rows, found_positions: the storages that are an allocation of the iteration, and its position.
        root_rows, root_enters, root_inputs: the submodule storages that are a model input: the own mark (the
            model's latest forward enter) whose storage it is, and which of that mark's storages.
        seen_rows: the submodule storages their mark's role names (the roles of the marks the template places).
        seen_positions, seen_codes: theirs and the templated observations': the allocation each is (-1: found by
            address) and the category it was seen in.
        observed_before, observed_has_before: the event before each templated observation's place.
    """

    template: MarkTemplate
    count: int
    made: np.ndarray
    position: np.ndarray
    allocations: np.ndarray
    placed: int
    kinds: np.ndarray
    modules: np.ndarray
    bounds: np.ndarray
    widths: np.ndarray
    own_rows: np.ndarray
    own: np.ndarray
    before: np.ndarray
    has_before: np.ndarray
    after: np.ndarray
    checked: np.ndarray
    mark_of: np.ndarray
    storage_ptrs: np.ndarray
    found_rows: np.ndarray
    found_positions: np.ndarray
    root_rows: np.ndarray
    root_enters: np.ndarray
    root_inputs: np.ndarray
    seen_rows: np.ndarray
    seen_positions: np.ndarray
    seen_codes: np.ndarray
    observed_before: np.ndarray
    observed_has_before: np.ndarray


_plans: OrderedDict[tuple[int, int], TemplatePlan] = OrderedDict()


def plan_of(template: MarkTemplate, count: int) -> TemplatePlan:
    """The plan of ``template`` placed among ``count`` events (``count`` at most its own), built once and kept
    for the last few templates."""
    key = (id(template), count)
    found = _plans.get(key)
    if found is not None and found.template is template:
        _plans.move_to_end(key)
        return found
    found = _plans[key] = build_plan(template, count)
    while len(_plans) > _PLANS_KEPT:
        _plans.popitem(last=False)
    return found


def build_plan(template: MarkTemplate, count: int) -> TemplatePlan:
    """A :class:`TemplatePlan`, worked out (:func:`plan_of` keeps it)."""
    made = template.sizes[:count] > 0
    kinds, modules, bounds, widths = (template.marks[:, c] for c in range(4))
    placed = int(np.searchsorted(bounds > count, True)) if len(bounds) and bounds[-1] > count else len(bounds)
    kinds, modules, bounds, widths = kinds[:placed], modules[:placed], bounds[:placed], widths[:placed]
    own_rows = np.flatnonzero(modules <= 0)  # (:func:`memprof.analysis.template.synthesized`'s rule)
    own = np.full(placed, -1, dtype=np.int64)
    own[own_rows] = np.arange(len(own_rows))
    storages = template.storages[:int(widths.sum())]
    codes = storages[:, 0]
    mark_of = np.repeat(np.arange(placed), widths)
    submodule = own[mark_of] < 0
    found_rows = np.flatnonzero(codes >= 0)
    root_rows = np.flatnonzero((codes <= ROOT_INPUT) & submodule)
    enters = np.zeros(placed, dtype=bool)
    enters[own_rows] = (kinds[own_rows] == _FORWARD_ENTER) & (modules[own_rows] == 0)
    latest = np.maximum.accumulate(np.where(enters, own, -1)) if placed else own  # the model's latest forward enter
    roles = np.where(submodule, _ROLE_OF_KIND[kinds[mark_of]], -1)
    seen_rows = np.flatnonzero(roles >= 0)
    observed = template.observations  # (bound, category, how found, address); none of them inputs
    return TemplatePlan(
        template=template, count=count, made=made, position=np.cumsum(made) - 1, allocations=np.flatnonzero(made),
        placed=placed, kinds=kinds, modules=modules, bounds=bounds, widths=widths, own_rows=own_rows, own=own,
        before=np.maximum(bounds - 1, 0), has_before=(bounds > 0) & (count > 0),
        after=np.minimum(bounds, max(count - 1, 0)), checked=(own < 0) & (bounds < count), mark_of=mark_of,
        storage_ptrs=np.where(submodule, storages[:, 1], 0), found_rows=found_rows,
        found_positions=codes[found_rows], root_rows=root_rows, root_enters=latest[mark_of[root_rows]],
        root_inputs=ROOT_INPUT - codes[root_rows], seen_rows=seen_rows,
        seen_positions=np.concatenate([np.where(codes[seen_rows] >= 0, codes[seen_rows], -1),
                                       np.maximum(observed[:, 2], -1)]),
        seen_codes=np.concatenate([roles[seen_rows], observed[:, 1]]),
        observed_before=np.maximum(observed[:, 0] - 1, 0), observed_has_before=(observed[:, 0] > 0) & (count > 0))
