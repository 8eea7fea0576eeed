"""What an iteration that keeps no detail needs of the sweep, in array operations.

Most iterations of a run keep no detail: the analysis reads their peak, the categories there, and the blocks
alive at their end, never their per-change series, calls or layers. :func:`summary_sweep` finds exactly those
facts of :func:`memprof.analysis.sweep.sweep` (the test holds it to :func:`memprof.analysis.attribution.
sweep_reference`, fact for fact) without the per-event walk:

- which block each event makes or frees is :func:`memprof.analysis.template.pairing` (a free that pairs with no
  allocation of the iteration frees a carried block at its address, or nothing);
- which block a hook's storage is at its moment is the last event at its address before it (an allocation: that
  block; a free: none), or the carried block at the address where there is no such event;
- a block's category is the highest-ranked role any of its storages was seen in (the sweep's rule, which makes
  the order of the sightings irrelevant), with the forward's rule (what the root's forward made and left alive
  when it ended is a feature map) as one more sighting;
- the phase and module each mark leaves, and where the forward ended, come from the sweep's own mark handlers
  walked over the marks alone (:mod:`memprof.analysis.marks_walk`).

A free of a storage older than profiling, which the hooks saw die, is one more free among the events
(:func:`with_frees`). What the array form cannot decide the same way returns ``None`` and the caller sweeps: a
free lost before an allocation at a live address, DDP's bucket rebuilds, the model's inputs
made before profiling, a storage seen in no role (``other``), and modules whose first forward call the run has
not placed yet. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from memprof.analysis.attribution import _MARK_ROLES, _RANK, FEATURE, INPUTS, N_CAT, OTHER, PHASE_OTHER
from memprof.analysis.marks_walk import MarksCache, MarksFacts
from memprof.analysis.records import AllocationEvents, BlockTable, LiveBlock, Mark, block_table
from memprof.analysis.sweep import in_time_order
from memprof.analysis.template import pairing

_UNSEEN = len(_RANK)  # the rank of a block no role was seen for yet (below every category's)
_CATEGORY_OF_RANK = np.array([c for c, _ in sorted(_RANK.items(), key=lambda item: item[1])] + [OTHER], dtype=np.int64)
_RANK_OF_CATEGORY = np.array([_RANK[c] for c in range(N_CAT)], dtype=np.int64)
_REBUILT = int(Mark.BUCKETS_REBUILT)


@dataclass(frozen=True)
class Summary:
    """The sweep's facts that an iteration keeping no detail reads (names as in :class:`Sweep` and the row).

    Attributes:
        total: allocated bytes after k changes, k = 0..n (:func:`memprof.analysis.timeline.peak_figures`).
        at_peak: each category's bytes at the first highest total.
        peak_phase: phase code of the change that reached the peak (``PHASE_OTHER`` where none did).
        peak_module: module index of that change (-1: none).
        num_allocations: blocks the iteration allocated.
        micro_batches: forward/backward pairs of the root module (1: not split).
        live: blocks alive at the end, in the sweep's order, with their categories.
        next_block_id: first id for the next iteration's blocks.
    """

    total: np.ndarray
    at_peak: np.ndarray
    peak_phase: int
    peak_module: int
    num_allocations: int
    micro_batches: int
    live: BlockTable
    next_block_id: int


class Sightings(NamedTuple):
    """Storages seen in a role: by the marks that imply one, and by the hooks' observations (arrays, one entry each).

    Attributes:
        positions: the iteration's allocation the storage is, where known already (>= 0); -1: found by address.
        ptrs: the storage's address.
        bounds: the events before the sighting.
        codes: the category code it was seen in.
        inputs: whether it makes a block where none is alive (a model input with bytes, made before profiling).
    """

    positions: np.ndarray
    ptrs: np.ndarray
    bounds: np.ndarray
    codes: np.ndarray
    inputs: np.ndarray


class _Resolver:
    """Which block a storage is after a given number of events (block indices as the sweep numbers them: the
    carried blocks first, then the iteration's allocations in order)."""

    def __init__(self, ptrs: np.ndarray, made: np.ndarray, carried_ptrs: np.ndarray,
                 order: np.ndarray | None = None) -> None:
        count = len(ptrs)
        self.order = np.argsort(ptrs, kind="stable") if order is None else order  # by address, then time
        self.by_address = ptrs[self.order]
        first = np.ones(count, dtype=bool)
        first[1:] = self.by_address[1:] != self.by_address[:-1]
        self.first_sorted = first
        self.first = np.empty(count, dtype=bool)  # per event in time order: the first at its address
        self.first[self.order] = first
        self.group, self.span = np.cumsum(first) - 1, count + 1
        self.keys = self.group * self.span + self.order
        self.made = made
        self.position = np.cumsum(made) - 1
        self.carried = len(carried_ptrs)
        self.carried_order = np.argsort(carried_ptrs, kind="stable")
        self.carried_sorted = carried_ptrs[self.carried_order]

    def carried_block(self, ptrs: np.ndarray) -> np.ndarray:
        """The carried block at each address (-1: none)."""
        if not self.carried:
            return np.full(len(ptrs), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.carried_sorted, ptrs), self.carried - 1)
        return np.where(self.carried_sorted[at] == ptrs, self.carried_order[at], -1)

    def blocks(self, ptrs: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """The block alive at each address after that many events (-1: none)."""
        count = len(self.by_address)
        out = self.carried_block(ptrs)
        if not count:
            return out
        lo = np.minimum(np.searchsorted(self.by_address, ptrs, side="left"), count - 1)
        seen = self.by_address[lo] == ptrs
        last = np.searchsorted(self.keys, self.group[lo] * self.span + bounds, side="left") - 1
        before = seen & (last >= lo)  # an event at the address before the bound: its last decides
        event = self.order[np.where(before, last, 0)]
        found = np.where(self.made[event], self.carried + self.position[event], -1)
        return np.where(before, found, out)


def hook_sightings(marks: Sequence[Any], bounds: np.ndarray, observations: Sequence[Any],
                   times: np.ndarray) -> Sightings:
    """The sightings in the hooks' own records (marks as :data:`MarkRow`, observations as :data:`ObservationRow`)."""
    rows = [(ptr, bound, role, role == INPUTS and nbytes > 0)
            for (_, kind, module, payload), bound in zip(marks, bounds.tolist())
            if (role := _MARK_ROLES.get(kind)) is not None and (role != INPUTS or module == 0)
            for ptr, nbytes in payload]
    ptrs, at, codes, inputs = (list(column) for column in zip(*rows)) if rows else ([], [], [], [])
    if observations:
        table = np.asarray(observations, dtype=np.int64).reshape(-1, 4)
        ptrs.extend(table[:, 1].tolist())
        at.extend(np.searchsorted(times, table[:, 0], side="right").tolist())
        codes.extend(table[:, 2].tolist())
        inputs.extend(((table[:, 2] == INPUTS) & (table[:, 3] > 0)).tolist())
    return Sightings(np.full(len(ptrs), -1, dtype=np.int64), np.asarray(ptrs, dtype=np.int64),
                     np.asarray(at, dtype=np.int64), np.asarray(codes, dtype=np.int64), np.asarray(inputs, dtype=bool))


def with_frees(events: AllocationEvents, baseline_frees: Sequence[Any]) -> AllocationEvents:
    """Time-ordered ``events`` with the frees of storages older than profiling among them, as frees: each before
    the events of its moment, those of one moment by address (the sweep's order of its records)."""
    if not baseline_frees:
        return events
    rows = sorted((int(t), int(ptr)) for t, ptr in baseline_frees)
    times = np.fromiter((t for t, _ in rows), dtype=np.int64, count=len(rows))
    at = np.searchsorted(events.time_ns, times, side="left")
    ptrs = np.fromiter((p for _, p in rows), dtype=np.int64, count=len(rows))
    gone = np.full(len(rows), -1, dtype=np.int64)  # (a free; its bytes are its block's)
    return AllocationEvents(np.insert(events.time_ns, at, times), np.insert(events.ptr, at, ptrs),
                            np.insert(events.size_bytes, at, gone), np.insert(events.total_allocated_bytes, at, -1),
                            np.insert(events.total_reserved_bytes, at, -1))


def summary_sweep(events: AllocationEvents, marks: Sequence[Any], observations: Sequence[Any],
                  baseline_frees: Sequence[Any], carried: Sequence[LiveBlock], next_block_id: int, known_modules: Any,
                  cache: MarksCache) -> Summary | None:
    """The facts of :func:`memprof.analysis.sweep.sweep` (same arguments, ``use_truth=False``) an iteration that
    keeps no detail reads; ``None`` where the sweep must decide (module docstring).

    Args:
        known_modules: modules the run has ordered by first forward call (the carried state's ``order``).
        cache: the walked marks of earlier iterations.
    """
    if any(m[1] == _REBUILT for m in marks):
        return None
    events = with_frees(in_time_order(events), baseline_frees)
    times = np.asarray(events.time_ns, dtype=np.int64)
    count = len(marks)
    bounds = np.searchsorted(times, np.fromiter((m[0] for m in marks), dtype=np.int64, count=count), side="right")
    facts = cache.facts(np.fromiter((m[1] for m in marks), dtype=np.int64, count=count),
                        np.fromiter((m[2] for m in marks), dtype=np.int64, count=count), bounds)
    return summarise(events, facts, hook_sightings(marks, bounds, observations, times), carried, next_block_id,
                     known_modules)


def summarise(events: AllocationEvents, facts: MarksFacts, seen: Sightings, carried: Sequence[LiveBlock],
              next_block_id: int, known_modules: Any, paired: np.ndarray | None = None,
              order: np.ndarray | None = None,
              attribute_with: Callable[[MarksFacts, Sightings, Resolved], Attribution | None] | None = None
              ) -> Summary | None:
    """:func:`summary_sweep` from time-ordered events, the marks' facts and the sightings (a steady iteration's come
    from its template: :func:`memprof.analysis.template_summary.template_summary`); ``paired``: the events'
    :func:`memprof.analysis.template.pairing`, and ``order`` the events by address then time (the sort it was made
    with), where the caller has them; ``attribute_with``: what attributes it instead of :func:`attribute` (a
    :class:`memprof.analysis.summary_memo.SummaryMemo`'s, which reuses the previous iteration's where it repeats)."""
    if not facts.forward_modules <= known_modules.keys():
        return None
    found = resolve(events, seen, carried, paired, order)
    if found is None:
        return None
    attributed = (attribute_with or attribute)(facts, seen, found)
    return None if attributed is None else attributed.summary(found, next_block_id)


class Resolved(NamedTuple):
    """What the addresses of an iteration's events and sightings resolve to (:func:`resolve`).

    Attributes:
        ptrs, sizes: the events' addresses and sizes (negative: a free), in time order.
        carried_table: the carried blocks (columns: id, address, bytes, category).
        resolver: which block an address is after a number of events.
        paired: the events' :func:`memprof.analysis.template.pairing`.
        blocks: the block each sighting is (-1: none).
        freed_carried: per event, the carried block it frees (-1: none).
    """

    ptrs: np.ndarray
    sizes: np.ndarray
    carried_table: np.ndarray
    resolver: _Resolver
    paired: np.ndarray
    blocks: np.ndarray
    freed_carried: np.ndarray


def resolve(events: AllocationEvents, seen: Sightings, carried: Sequence[LiveBlock], paired: np.ndarray | None = None,
            order: np.ndarray | None = None) -> Resolved | None:
    """The blocks the events' and sightings' addresses are; ``None`` where an allocation came at an address where
    a block was alive (its free was lost: the sweep decides)."""
    ptrs, sizes = np.asarray(events.ptr, dtype=np.int64), np.asarray(events.size_bytes, dtype=np.int64)
    carried_table = block_table(carried)
    resolver = _Resolver(ptrs, sizes > 0, carried_table[:, 1], order)
    paired = pairing(ptrs, sizes, resolver.order) if paired is None else paired
    if _lost_frees(resolver, resolver.made):
        return None
    return Resolved(ptrs, sizes, carried_table, resolver, paired, _sighted_blocks(resolver, seen),
                    _carried_frees(resolver, ptrs, paired))


class Attribution(NamedTuple):
    """What :func:`summarise` finds of an iteration before it lists the blocks alive at its end.

    Attributes:
        total, at_peak, peak_phase, peak_module, num_allocations, micro_batches: as in :class:`Summary`.
        categories: each block's category (the carried ones first, then the iteration's allocations).
        block: the block each change makes or frees, per event that changes anything.
        made: whether each of those changes is an allocation.
        kept: the carried blocks alive at the end.
        alive: the iteration's allocations alive at the end, by position.
    """

    total: np.ndarray
    at_peak: np.ndarray
    peak_phase: int
    peak_module: int
    num_allocations: int
    micro_batches: int
    categories: np.ndarray
    block: np.ndarray
    made: np.ndarray
    kept: np.ndarray
    alive: np.ndarray

    def summary(self, resolved: Resolved, next_block_id: int) -> Summary:
        """The :class:`Summary` of the iteration ``resolved`` describes, with the blocks alive at its end (their
        ids from ``next_block_id``)."""
        made = resolved.resolver.made
        return Summary(total=self.total, at_peak=self.at_peak, peak_phase=self.peak_phase,
                       peak_module=self.peak_module, num_allocations=self.num_allocations,
                       micro_batches=self.micro_batches,
                       live=_live(resolved.carried_table, self, resolved.ptrs[made], resolved.sizes[made],
                                  next_block_id),
                       next_block_id=next_block_id + self.num_allocations)


def _sighted_blocks(resolver: _Resolver, seen: Sightings) -> np.ndarray:
    """The block each sighting is (-1: none; the carried blocks first, then the iteration's allocations)."""
    n_carried = resolver.carried
    blocks = np.where(seen.positions >= 0, n_carried + seen.positions, -1)
    unknown = seen.positions < 0
    if unknown.any():
        blocks[unknown] = resolver.blocks(seen.ptrs[unknown], seen.bounds[unknown])
    return blocks


def _carried_frees(resolver: _Resolver, ptrs: np.ndarray, paired: np.ndarray) -> np.ndarray:
    """Per event, the carried block it frees (the first event at a carried block's address, a free that pairs
    with no allocation of the iteration), else -1."""
    out = np.full(len(paired), -1, dtype=np.int64)
    first = ~resolver.made & (paired < 0) & resolver.first
    if first.any():
        out[first] = resolver.carried_block(ptrs[first])
    return out


def attribute(facts: MarksFacts, seen: Sightings, resolved: Resolved) -> Attribution | None:
    """:func:`summarise`'s attribution of an iteration whose addresses are ``resolved``; ``None`` where it
    declines (a carried block of no category, a sighting that would make a block or says ``other``)."""
    carried_table, resolver, sizes, paired = resolved.carried_table, resolved.resolver, resolved.sizes, resolved.paired
    made = resolver.made
    n_carried = len(carried_table)
    if bool((carried_table[:, 3] < 0).any()):
        return None
    n_made = len(resolver.position) and int(resolver.position[-1]) + 1
    ranks = np.full(n_carried + n_made, _UNSEEN, dtype=np.int64)
    ranks[:n_carried] = _RANK_OF_CATEGORY[carried_table[:, 3]]
    if not _seen(ranks, seen, resolved.blocks):
        return None
    _forward_rule(ranks, facts, made, paired, n_carried)
    # the changes: every event but a free of an address not alive (a carried block is freed by the first event
    # at its address; a free after a free frees nothing)
    block = np.where(made, n_carried + resolver.position, n_carried + paired)
    unpaired = ~made & (paired < 0)
    block[unpaired] = resolved.freed_carried[unpaired]
    kept = block >= 0
    block = block[kept]
    all_sizes = np.concatenate([carried_table[:, 2], sizes[made]])
    categories = _CATEGORY_OF_RANK[ranks]
    signed = np.where(made[kept], all_sizes[block], -all_sizes[block])
    total = np.empty(len(block) + 1, dtype=np.int64)
    total[0] = int(all_sizes[:n_carried].sum())
    np.cumsum(signed, out=total[1:])
    total[1:] += total[0]
    k = int(np.argmax(total))
    at_peak = np.zeros(N_CAT, dtype=np.int64)
    np.add.at(at_peak, categories[:n_carried], all_sizes[:n_carried])
    np.add.at(at_peak, categories[block[:k]], signed[:k])
    phase, module = PHASE_OTHER, -1
    if k > 0:
        j = int(np.searchsorted(facts.bounds, int(np.flatnonzero(kept)[k - 1]), side="right")) - 1
        if j >= 0:
            phase, module = int(facts.phases[j]), int(facts.modules[j])
    freed = np.zeros(len(categories), dtype=bool)
    freed[block[~made[kept]]] = True
    return Attribution(total=total, at_peak=at_peak, peak_phase=phase, peak_module=module, num_allocations=n_made,
                       micro_batches=facts.micro_batches, categories=categories, block=block, made=made[kept],
                       kept=np.flatnonzero(~freed[:n_carried]), alive=np.flatnonzero(~freed[n_carried:]))


def _lost_frees(resolver: _Resolver, made: np.ndarray) -> bool:
    """Whether an allocation came at an address where a block was alive (its free was lost)."""
    made_sorted = made[resolver.order]
    first = resolver.first_sorted
    if bool((made_sorted[1:] & ~first[1:] & made_sorted[:-1]).any()):
        return True
    opening = made_sorted & first  # the first event at an address is an allocation: was a carried block there?
    return bool((resolver.carried_block(resolver.by_address[opening]) >= 0).any())


def _seen(ranks: np.ndarray, seen: Sightings, blocks: np.ndarray) -> bool:
    """Lowers each block's rank to that of every role its storages were seen in (``blocks``: which block each
    sighting is); ``False`` where a sighting would make a block (a model input made before profiling) or says
    ``other`` (the forward's rule would then depend on the order of the sightings)."""
    if not len(seen.codes):
        return True
    if bool((seen.codes == OTHER).any()):
        return False
    if bool((seen.inputs & (blocks < 0)).any()):
        return False
    found = blocks >= 0
    np.minimum.at(ranks, blocks[found], _RANK_OF_CATEGORY[seen.codes[found]])
    return True


def _forward_rule(ranks: np.ndarray, facts: MarksFacts, made: np.ndarray, paired: np.ndarray, n_carried: int) -> None:
    """What the root's forward made and left alive at its end is at least a feature map."""
    if not len(facts.forward_events):
        return
    count = len(made)
    end = np.full(count, -1, dtype=np.int64)  # per event run in a forward that ended: the events before its end
    inside = facts.forward_events < count
    end[facts.forward_events[inside]] = facts.forward_ends[inside]
    made_at = np.flatnonzero(made)  # the event of each allocation
    freed_at = np.full(len(made_at), count, dtype=np.int64)  # the event that frees it
    frees = np.flatnonzero(~made & (paired >= 0))
    freed_at[paired[frees]] = frees
    ended = end[made_at]
    alive = (ended >= 0) & (freed_at >= ended)
    np.minimum.at(ranks, n_carried + np.flatnonzero(alive), _RANK[FEATURE])


def _live(carried: np.ndarray, attributed: Attribution, made_ptrs: np.ndarray, made_sizes: np.ndarray,
          next_block_id: int) -> BlockTable:
    """The blocks alive at the end, in the sweep's order: the carried ones left, then the new ones as made."""
    kept, alive, categories = attributed.kept, attributed.alive, attributed.categories
    table = np.empty((len(kept) + len(alive), 4), dtype=np.int64)
    table[:len(kept), :3] = carried[kept, :3]
    table[len(kept):, 0] = next_block_id + alive
    table[len(kept):, 1] = made_ptrs[alive]
    table[len(kept):, 2] = made_sizes[alive]
    table[:len(kept), 3] = categories[kept]
    table[len(kept):, 3] = categories[len(carried) + alive]
    return BlockTable(table)
