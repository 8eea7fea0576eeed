"""The sweep as the analysis runs it: :func:`memprof.analysis.attribution.sweep_reference`, with its hot loop trimmed.

The reference merges every allocator event with the hooks' records into one list of tuples, sorts it and
walks it, and for each allocation appends to eleven lists. Here only the hooks' records (a few hundred:
marks, observations, frees of pre-existing storages) are sorted; the allocator's events, already in time
order, run in segments between them (``numpy.searchsorted`` finds where each record falls), and per event
the loop does only what depends on the order of events: which block an address holds. What is the same for a
whole segment, or follows from the rest, is filled in at the end with array operations:

- a change's phase and module change only at marks, so they are kept per segment and repeated;
- a change's sign is +1 exactly where it is its block's allocation;
- a new block's id is the run's next id in order of creation, so the ids are known before the walk;
- the allocator's running total (CUDA) belongs to the change its event made (frees of unknown
  addresses make none, and the walker's own frees carry none).

The marks, observations and frees of pre-existing storages go through the reference's own handlers
(:class:`memprof.analysis.attribution._Walker`), so what they decide is decided once.
``tests/memprof/analysis/test_sweep.py`` checks that both give the same :class:`Sweep`, field for field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import islice
from typing import Any

import numpy as np

from memprof.analysis.attribution import (
    _MARK_HANDLERS,
    _MARK_ROLES,
    _RANK,
    INPUTS,
    OTHER,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    Call,
    Sweep,
    _Walker,
)
from memprof.analysis.records import AllocationEvents, LiveBlock, Mark


@lru_cache(maxsize=8)
def _lineages(parents: tuple[int, ...]) -> tuple[frozenset[int], ...]:
    """Each module with its ancestors: whether one module is another's ancestor, in one set lookup."""
    found = []
    for module in range(len(parents)):
        line = set()
        while module >= 0:
            line.add(module)
            module = parents[module]
        found.append(frozenset(line))
    return tuple(found)


class _SegmentWalker(_Walker):
    """The reference's walker over preallocated block lists, whose changes record only their block.

    Args:
        carried: blocks alive when the iteration started.
        parents: parent module index of each module.
        next_block_id: first id to give a new block.
        capacity: new blocks there may be (more are made room for when needed).
    """

    def __init__(self, carried: Sequence[LiveBlock], parents: list[int], next_block_id: int, capacity: int) -> None:
        super().__init__(carried, parents, next_block_id)
        s = self.s
        self.first_id, self.carried = next_block_id, len(s.sizes)
        self.blocks = self.carried  # blocks made so far, carried ones included
        self._grow(capacity)
        self.own_changes: list[int] = []  # changes the walker made (frees): no allocator total
        self.lineages = _lineages(tuple(parents))

    # --- the reference's handlers' hottest parts, each given the same result in fewer steps
    def _is_ancestor(self, ancestor: int, module: int) -> bool:
        return module >= 0 and ancestor in self.lineages[module]

    def _ids(self, payload: Any) -> tuple[tuple[int, ...], int]:
        if len(payload) != 1:
            return super()._ids(payload)
        (ptr, nbytes), = payload
        block = self.s.live.get(ptr)
        return ((self.s.block_ids[block],), self.s.sizes[block]) if block is not None else ((-ptr,), nbytes)

    def _close_backward(self, keep: int | None, time_ns: int) -> None:
        lineages, s = self.lineages, self.s
        related = lineages[keep] if keep is not None and keep >= 0 else None  # keep and its ancestors
        still_open = []
        for call in self.bwd_stack:  # open while an ancestor or a descendant of keep
            module = call.module
            if related is not None and (module in related or (module >= 0 and keep in lineages[module])):
                still_open.append(call)
            else:
                call.end_change, call.end_ns = len(s.change_block), time_ns
                s.backward_calls.append(call)
        self.bwd_stack = still_open

    def _bwd_enter(self, time_ns: int, module: int, payload: Any) -> None:
        if self.phase == PHASE_FORWARD:
            self._end_forward()
        self.phase = PHASE_BACKWARD
        self._close_backward(module, time_ns)
        stack, lineages, s = self.bwd_stack, self.lineages, self.s
        position = len(stack)  # below the first open call inside this module (the reference's rule)
        for index, call in enumerate(stack):
            if call.module >= 0 and module in lineages[call.module]:
                position = index
                break
        start, start_ns, start_mark = len(s.change_block), time_ns, len(s.marks)
        for call in stack[position:]:
            start = min(start, call.start_change)
            start_ns = min(start_ns, call.start_ns)
            start_mark = min(start_mark, call.start_mark)
        stack.insert(position, Call(module, start, start_ns, start_mark=start_mark))

    def mark(self, time_ns: int, kind: int, module: int, payload: Any) -> None:
        role = _MARK_ROLES.get(kind, INPUTS)
        if role == INPUTS:  # a forward enter (the model's inputs) or a mark whose storages have no role: the reference's
            super().mark(time_ns, kind, module, payload)
            return
        s = self.s
        live, categories, rank = s.live, s.categories, _RANK[role]
        for ptr, _ in payload:  # observed in the mark's role (_Walker.observe, for an address that is alive)
            block = live.get(ptr)
            if block is not None:
                current = categories[block]
                if current < 0 or rank < _RANK[current]:
                    categories[block] = role
        _HANDLERS[kind](self, time_ns, module, payload)
        s.marks.append((time_ns, kind, module, len(s.change_block), self.phase))

    def _grow(self, count: int) -> None:
        s = self.s
        start = self.first_id + len(s.sizes) - self.carried
        s.block_ids.extend(range(start, start + count))
        s.sizes.extend([0] * count)
        s.categories.extend([-1] * count)
        s.alloc_change.extend([-1] * count)
        s.free_change.extend([-1] * count)

    def _new_block(self, block_id: int, ptr: int, size: int, category: int, change: int) -> int:
        index = self.blocks
        if index >= len(self.s.sizes):
            self._grow(max(16, index))
        self.blocks += 1
        s = self.s
        s.sizes[index], s.categories[index], s.alloc_change[index] = size, category, change
        s.live[ptr] = index
        return index

    def _change(self, block: int, sign: int, truth: int) -> int:
        change_block = self.s.change_block
        self.own_changes.append(len(change_block))
        change_block.append(block)
        return len(change_block) - 1

    def finish(self, segments: list[tuple[int, int, int]], skipped: list[tuple[int, int]], totals: list[int] | None,
               use_truth: bool) -> Sweep:
        """Trims the block lists and fills in each change's sign, phase, module and allocator total."""
        s = self.s
        count = self.blocks
        for values in (s.block_ids, s.sizes, s.categories, s.alloc_change, s.free_change):
            del values[count:]
        s.categories = [OTHER if c < 0 else c for c in s.categories]
        s.next_block_id = self.first_id + count - self.carried
        n = len(s.change_block)
        block = np.fromiter(s.change_block, dtype=np.int64, count=n)
        alloc = np.fromiter(s.alloc_change, dtype=np.int64, count=count)
        s.change_sign = np.where(alloc[block] == np.arange(n), 1, -1)
        starts = [k for k, _, _ in segments] + [n]
        lengths = [end - start for start, end in zip(starts, starts[1:])]
        s.change_phase = np.repeat(np.asarray([p for _, p, _ in segments], dtype=np.int64), lengths)
        s.change_module = np.repeat(np.asarray([m for _, _, m in segments], dtype=np.int64), lengths)
        s.change_truth = self._truths(n, skipped, totals) if use_truth and totals is not None else np.full(n, -1, dtype=np.int64)
        return s

    def _truths(self, n: int, skipped: list[tuple[int, int]], totals: list[int]) -> np.ndarray:
        """The allocator's running total after each change's event (-1 for the walker's own frees)."""
        truth = np.full(n, -1, dtype=np.int64)
        own = np.asarray(self.own_changes, dtype=np.int64)
        mine = np.ones(n, dtype=bool)
        mine[own] = False
        # a skipped free is the event after the events that made the changes before it, and the frees skipped before it
        kept = np.ones(len(totals), dtype=bool)
        for ordinal, (change, _) in enumerate(skipped):
            kept[change - int(np.searchsorted(own, change)) + ordinal] = False
        truth[mine] = np.asarray(totals, dtype=np.int64)[kept]
        return truth


# The reference's handlers, with this walker's own where it has one (a mark whose storages are inputs, or that has
# none, goes through the reference's mark and handlers).
_HANDLERS: dict[int, Callable[[Any, int, int, Any], None]] = {**_MARK_HANDLERS, Mark.BWD_ENTER: _SegmentWalker._bwd_enter}


def _hook_items(baseline_frees: list, observations: list, marks: list) -> list[tuple]:
    """The hooks' records as the reference's merged tuples (``_merge``), in the same order among themselves."""
    items: list[tuple] = [(t, 0, -1, "f", p, 0, -1) for t, p in baseline_frees]
    items.extend((t, 1, i, "o", p, c, n) for i, (t, p, c, n) in enumerate(observations))
    items.extend((m[0], 2, i, "m", int(m[1]), m[2], m[3]) for i, m in enumerate(marks))
    items.sort()
    return items


def in_time_order(events: AllocationEvents) -> AllocationEvents:
    """The events sorted by time, ties in their given order (as the reference's merge orders them)."""
    times = events.time_ns
    if len(times) < 2 or bool((times[1:] >= times[:-1]).all()):
        return events
    order = np.argsort(times, kind="stable")
    return AllocationEvents(*(np.asarray(column)[order] for column in (
        events.time_ns, events.ptr, events.size_bytes, events.total_allocated_bytes, events.total_reserved_bytes)))


def _bounds(times: np.ndarray, items: list[tuple]) -> list[int]:
    """How many events come before each hook item: at equal times a free of a pre-existing storage comes
    before the allocator's events, an observation or a mark after them."""
    if not items:
        return []
    at = np.fromiter((item[0] for item in items), dtype=np.int64, count=len(items))
    before = np.fromiter((item[1] == 0 for item in items), dtype=bool, count=len(items))
    left = np.searchsorted(times, at, side="left")
    right = np.searchsorted(times, at, side="right")
    return np.where(before, left, right).tolist()


def sweep(events: AllocationEvents, marks: list, observations: list, baseline_frees: list,
          carried: Sequence[LiveBlock], parents: list[int], next_block_id: int, use_truth: bool) -> Sweep:
    """:func:`memprof.analysis.attribution.sweep_reference`, faster (module docstring); same arguments, same result."""
    events = in_time_order(events)
    ptrs, sizes_in = events.ptr.tolist(), events.size_bytes.tolist()
    items = _hook_items(baseline_frees, observations, marks)
    bounds = _bounds(events.time_ns, items)
    capacity = int(np.count_nonzero(events.size_bytes > 0)) + 8
    walker = _SegmentWalker(carried, parents, next_block_id, capacity)
    s = walker.s
    live, sizes, alloc_change, free_change, c_block = s.live, s.sizes, s.alloc_change, s.free_change, s.change_block
    segments = [(0, walker.phase, walker._module())]
    skipped: list[tuple[int, int]] = []  # (changes before it, address) of each free of an address not alive
    stream = zip(ptrs, sizes_in)
    position = 0
    for item, bound in zip([*items, None], [*bounds, len(ptrs)]):
        if bound > position:
            first = block = walker.blocks
            change = len(c_block)
            for a, b in islice(stream, bound - position):
                if b > 0:
                    old = live.setdefault(a, block)
                    if old != block:  # the free was lost (e.g. during a restart gap): close the old block
                        free_change[old] = change
                        walker.own_changes.append(change)
                        c_block.append(old)
                        change += 1
                        live[a] = block
                    if block >= len(sizes):
                        walker.blocks = block
                        walker._grow(max(16, block))
                    sizes[block] = b
                    alloc_change[block] = change
                    c_block.append(block)
                    block += 1
                else:
                    old = live.pop(a, -1)  # block indices are >= 0
                    if old < 0:
                        skipped.append((change, a))
                        continue
                    free_change[old] = change
                    c_block.append(old)
                change += 1
            walker.blocks = block
            if walker.phase == PHASE_FORWARD:
                walker.fwd_blocks.extend(range(first, block))
            position = bound
        if item is not None:
            _handle(walker, item, segments)
    return walker.finish(segments, skipped, events.total_allocated_bytes.tolist() if use_truth else None, use_truth)


def _handle(walker: _SegmentWalker, item: tuple[Any, ...], segments: list[tuple[int, int, int]]) -> None:
    """One hook record, by the reference's handlers; a mark may start a segment of another phase or module."""
    t, _, _, kind, a, b, c = item
    if kind == "f":
        walker.free(a, -1)
    elif kind == "o":
        walker.observe(a, b, c)
    else:
        walker.mark(t, a, b, c)
        phase, module = walker.phase, walker._module()
        last = segments[-1]
        if last[1] != phase or last[2] != module:
            at = len(walker.s.change_block)
            if last[0] == at:
                segments[-1] = (at, phase, module)
            else:
                segments.append((at, phase, module))
