"""Turns one iteration's allocator events and hook marks into attributed memory.

Every block the allocator handed out is classified into exactly one category, so the categories
always sum to the allocator's total. The work is split in two passes:

1. the sweep walks allocations, frees, observations and marks in time order, building the
   block table (who was allocated and freed when, in which phase and module) and the list of
   forward and backward calls: :func:`sweep_reference` here, the slow and obvious walk, and
   :func:`memprof.analysis.sweep.sweep`, the same walk with its hot loop trimmed, which the analysis runs;
2. :func:`series` turns the classified blocks into per-category live bytes after every change,
   from which the event rows, the iteration's peak and the per-layer costs are read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memprof.analysis.records import CAT, AllocationEvents, LiveBlock, Mark
from memprof.categories import CATEGORIES, MODEL_STATE, Category
from memprof.phases import PHASE_CODES, PHASE_OF_CODE, Phase

N_CAT = len(CATEGORIES)
OTHER = CAT[Category.OTHER]
FEATURE = CAT[Category.FEATURE_MAPS]
GRADS = CAT[Category.GRADS]
WEIGHT_GRADS = CAT[Category.WEIGHT_GRADS]
INPUTS = CAT[Category.INPUTS]
WEIGHT_COPIES = CAT[Category.WEIGHT_COPIES]
COMM_BUFFERS = CAT[Category.COMM_BUFFERS]
#: Lower wins when a block is seen in several roles (a gradient stolen into .grad is a weight grad; a DDP bucket
#: that the gradients are views of, ``gradient_as_bucket_view=True``, is the weight grads; a saved weight cast
#: returned by a module is a weight copy).
_RANK = {
    CAT[c]: r
    for r, c in enumerate([
        Category.WEIGHTS, Category.BUFFERS, Category.WEIGHT_GRADS, Category.OPTIMIZER_STATE,
        Category.INPUTS, Category.COMM_BUFFERS, Category.WEIGHT_COPIES, Category.GRADS, Category.FEATURE_MAPS,
        Category.OTHER,
    ])
}
MODEL_STATE_CODES = np.array([CAT[c] for c in MODEL_STATE])

PHASE_OTHER, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = (
    PHASE_CODES[Phase.OTHER], PHASE_CODES[Phase.FORWARD], PHASE_CODES[Phase.BACKWARD], PHASE_CODES[Phase.OPTIMIZER])
#: The sweep's code for the span after the model's forward returned and before its backward (or the optimizer, or
#: its next forward) began: where a training step computes its loss, and where Lightning's loop runs ``zero_grad``
#: (the backward's first mark comes when the model's output has its gradient, so the loss's own backward is in it
#: too). It is named ``forward`` (the loss is the forward pass's last part; :data:`PHASE_NAMES`) but has a code of its
#: own, so that the forward's rules do not apply to it: what it makes is no feature map by having been made there,
#: and no module of the model runs in it.
PHASE_LOSS = len(PHASE_CODES)
#: The phase each of the sweep's codes is named (the trace's ``peak_phase``, the allocations' ``phase``).
PHASE_NAMES: tuple[Phase, ...] = (*PHASE_OF_CODE, Phase.FORWARD)


@dataclass
class Call:
    """One forward or backward execution of a module, as indices into the change sequence."""

    module: int
    start_change: int
    start_ns: int
    end_change: int = -1
    end_ns: int = 0
    inputs: tuple = ()
    outputs: tuple = ()
    input_bytes: int = 0
    output_bytes: int = 0
    # index in Sweep.marks of the mark that began the call: which micro-batch it ran in (micro_batches.py)
    start_mark: int = -1


@dataclass
class Sweep:
    """What the time-ordered walk found (see module docstring)."""

    block_ids: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    alloc_change: list[int] = field(default_factory=list)  # -1: alive before the iteration
    free_change: list[int] = field(default_factory=list)  # -1: still alive
    change_block: list[int] = field(default_factory=list)  # block index of each change
    # (lists as the reference walk appends them; int64 arrays from memprof.analysis.sweep, which fills them at the end)
    change_sign: list[int] | np.ndarray = field(default_factory=list)
    change_phase: list[int] | np.ndarray = field(default_factory=list)
    change_module: list[int] | np.ndarray = field(default_factory=list)
    change_truth: list[int] | np.ndarray = field(default_factory=list)  # allocator's running total, or -1
    marks: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (ns, kind, module, change, phase)
    forward_calls: list[Call] = field(default_factory=list)
    backward_calls: list[Call] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)  # ptr -> block index
    next_block_id: int = 0


def _merge(events: AllocationEvents, baseline_frees: list, observations: list, marks: list) -> list[tuple]:
    # (time, tiebreak, index, type, a, b, c): at equal times the allocator's changes come first,
    # then the hooks' records in the order they were made.
    items: list[tuple] = [
        (t, 0, i, "c", p, s, a)
        for i, (t, p, s, a) in enumerate(zip(events.time_ns.tolist(), events.ptr.tolist(),
                                              events.size_bytes.tolist(), events.total_allocated_bytes.tolist()))
    ]
    items.extend((t, 0, -1, "f", p, 0, -1) for t, p in baseline_frees)
    items.extend((t, 1, i, "o", p, c, n) for i, (t, p, c, n) in enumerate(observations))
    items.extend((m[0], 2, i, "m", int(m[1]), m[2], m[3]) for i, m in enumerate(marks))
    # (time, tiebreak, index) is unique except between baseline frees (index -1), which then order by
    # kind and address, so the tuples' own order is the intended one and no key function is needed.
    items.sort()
    return items


class _Walker:
    """State of the sweep; one instance per iteration."""

    def __init__(self, carried: Sequence[LiveBlock], parents: list[int], next_block_id: int) -> None:
        self.s = Sweep()
        self.parents = parents
        self.next_block_id = next_block_id
        s = self.s
        if carried:
            ids, ptrs, sizes, categories = zip(*carried)
            s.block_ids.extend(ids)
            s.sizes.extend(sizes)
            s.categories.extend(categories)
            s.alloc_change.extend([-1] * len(carried))
            s.free_change.extend([-1] * len(carried))
            s.live.update(zip(ptrs, range(len(carried))))
        self.phase = PHASE_OTHER
        self.fwd_stack: list[Call] = []
        self.bwd_stack: list[Call] = []
        self.fwd_blocks: list[int] = []  # blocks allocated during the current root forward
        self.observed: dict[int, int] = {}
        # first change of DDP's bucket rebuild while its window is open, and the bytes the new buckets hold
        # (0: not known); see _buckets_rebuilt
        self.rebuild_change = -1
        self.rebuild_bytes = 0
        # each change's sign, phase, module and allocator total, as the walk appends them
        self.signs: list[int] = []
        self.phases: list[int] = []
        self.modules: list[int] = []
        self.truths: list[int] = []
        s.change_sign, s.change_phase, s.change_module, s.change_truth = self.signs, self.phases, self.modules, self.truths

    def _new_block(self, block_id: int, ptr: int, size: int, category: int, change: int) -> int:
        s = self.s
        index = len(s.sizes)
        s.block_ids.append(block_id)
        s.sizes.append(size)
        s.categories.append(category)
        s.alloc_change.append(change)
        s.free_change.append(-1)
        s.live[ptr] = index
        return index

    def _module(self) -> int:
        if self.phase == PHASE_FORWARD and self.fwd_stack:
            return self.fwd_stack[-1].module
        if self.phase == PHASE_BACKWARD and self.bwd_stack:
            return self.bwd_stack[-1].module
        return -1

    def _change(self, block: int, sign: int, truth: int) -> int:
        s = self.s
        s.change_block.append(block)
        self.signs.append(sign)
        self.phases.append(self.phase)
        self.modules.append(self._module())
        self.truths.append(truth)
        return len(s.change_block) - 1

    def free(self, ptr: int, truth: int) -> None:
        block = self.s.live.pop(ptr, None)
        if block is not None:
            self.s.free_change[block] = self._change(block, -1, truth)

    def observe(self, ptr: int, code: int, nbytes: int) -> None:
        block = self.s.live.get(ptr)
        if block is None:
            if code == INPUTS and nbytes > 0:
                # an input allocated before profiling began: alive since the iteration started
                self._new_block(self.next_block_id, ptr, nbytes, code, -1)
                self.next_block_id += 1
            return
        current = self.s.categories[block]
        if current < 0 or _RANK[code] < _RANK[current]:
            self.s.categories[block] = code

    def mark(self, time_ns: int, kind: int, module: int, payload: Any) -> None:
        if kind == Mark.BUCKETS_REBUILT:  # says what blocks are, not when something ran: no timeline row
            self._buckets_rebuilt(payload)
            return
        # The role a mark's storages play is implied by the mark, so the hooks do not record it
        # a second time as observations (that was most of what they appended on the training thread).
        role = _MARK_ROLES.get(kind)
        if role is not None and payload:
            if role == INPUTS:
                if module == 0:
                    for ptr, nbytes in payload:
                        self.observe(ptr, INPUTS, nbytes)
            else:
                for ptr, _ in payload:
                    self.observe(ptr, role, 0)
        handler = _MARK_HANDLERS[kind]
        handler(self, time_ns, module, payload)
        self.s.marks.append((time_ns, kind, module, len(self.s.change_block), self.phase))

    def _buckets_rebuilt(self, payload: Any) -> None:
        """DDP rebuilds its buckets at the start of its forward, before the module it wraps runs.

        The mark is stamped with the wrapper's forward enter. Its storages are the buckets that existed before
        profiling (stand-in addresses), freed there, and ``(0, bytes)``: what the new buckets hold. The new
        buckets are among what the wrapper allocates from there until the next module's forward begins and is
        still alive then (:meth:`_close_rebuild`).
        """
        for ptr, nbytes in payload:
            if ptr == 0:
                self.rebuild_bytes = nbytes
            else:
                self.free(ptr, -1)
        self.rebuild_change = len(self.s.change_block)

    def _close_rebuild(self) -> None:
        if self.rebuild_change < 0:
            return
        s = self.s
        alive = [b for b in self.fwd_blocks if s.alloc_change[b] >= self.rebuild_change and s.free_change[b] < 0]
        if self.rebuild_bytes > 0:
            # DDP's forward also allocates a few small tensors there (the rebuild agrees on the buckets' order with
            # the other ranks, and a communication thread at times frees one of those tensors later): the buckets
            # are the largest blocks, until they hold the bytes
            # the buckets do (a caching allocator rounds each block up, so they may hold a little more).
            chosen, taken = [], 0
            for block in sorted(alive, key=lambda b: -s.sizes[b]):
                if taken >= self.rebuild_bytes:
                    break
                chosen.append(block)
                taken += s.sizes[block]
            alive = chosen
        for block in alive:
            current = s.categories[block]
            if current < 0 or _RANK[COMM_BUFFERS] < _RANK[current]:
                s.categories[block] = COMM_BUFFERS
        self.rebuild_change, self.rebuild_bytes = -1, 0

    # --- mark handlers
    def _fwd_enter(self, time_ns: int, module: int, payload: Any) -> None:
        self._close_rebuild()
        if module == 0:
            self.phase = PHASE_FORWARD
            self.fwd_blocks = []
        call = Call(module, len(self.s.change_block), time_ns, start_mark=len(self.s.marks))
        call.inputs, call.input_bytes = self._ids(payload)
        self.fwd_stack.append(call)

    def _fwd_exit(self, time_ns: int, module: int, payload: Any) -> None:
        while self.fwd_stack:
            call = self.fwd_stack.pop()
            call.end_change, call.end_ns = len(self.s.change_block), time_ns
            if call.module == module:
                call.outputs, call.output_bytes = self._ids(payload)
                self.s.forward_calls.append(call)
                break
        if module == 0:
            self._end_forward()

    def _end_forward(self) -> None:
        self._close_rebuild()
        # What the forward allocated and is still alive when it returns is kept for backward.
        for block in self.fwd_blocks:
            if self.s.free_change[block] < 0 and self.s.categories[block] < 0:
                self.s.categories[block] = FEATURE
        self.fwd_blocks = []
        self.fwd_stack.clear()
        self.phase = PHASE_LOSS

    def _is_ancestor(self, ancestor: int, module: int) -> bool:
        while module >= 0:
            if module == ancestor:
                return True
            module = self.parents[module]
        return False

    def _close_backward(self, keep: int | None, time_ns: int) -> None:
        """Closes open backward calls that are neither ancestors nor descendants of ``keep``."""
        still_open = []
        for call in self.bwd_stack:
            if keep is not None and (self._is_ancestor(call.module, keep) or self._is_ancestor(keep, call.module)):
                still_open.append(call)
            else:
                call.end_change, call.end_ns = len(self.s.change_block), time_ns
                self.s.backward_calls.append(call)
        self.bwd_stack = still_open

    def _bwd_enter(self, time_ns: int, module: int, payload: Any) -> None:
        if self.phase == PHASE_FORWARD:
            self._end_forward()
        self.phase = PHASE_BACKWARD
        self._close_backward(module, time_ns)
        # Hooks on one gradient fire innermost module first, so a container can arrive after its
        # children: it goes below them on the stack and starts when the first of them started.
        position = next((i for i, c in enumerate(self.bwd_stack) if self._is_ancestor(module, c.module)),
                        len(self.bwd_stack))
        inner = self.bwd_stack[position:]
        start = min([len(self.s.change_block)] + [c.start_change for c in inner])
        start_ns = min([time_ns] + [c.start_ns for c in inner])
        start_mark = min([len(self.s.marks)] + [c.start_mark for c in inner])
        self.bwd_stack.insert(position, Call(module, start, start_ns, start_mark=start_mark))

    def _bwd_exit(self, time_ns: int, module: int, payload: Any) -> None:
        if not any(c.module == module for c in self.bwd_stack):
            return
        while self.bwd_stack:
            top = self.bwd_stack.pop()
            top.end_change, top.end_ns = len(self.s.change_block), time_ns
            self.s.backward_calls.append(top)
            if top.module == module:
                break

    def _bwd_end(self, time_ns: int, module: int, payload: Any) -> None:
        self._close_backward(None, time_ns)
        self.phase = PHASE_OTHER

    def _opt_enter(self, time_ns: int, module: int, payload: Any) -> None:
        self.phase = PHASE_OPTIMIZER

    def _opt_exit(self, time_ns: int, module: int, payload: Any) -> None:
        self.phase = PHASE_OTHER

    def _ids(self, payload: Any) -> tuple[tuple[int, ...], int]:
        # Block ids identify a storage generation; storages allocated before profiling get -ptr.
        # A live block's size is the allocator's; the hooks' own size (a tensor's bytes, not its
        # storage's) only counts for storages made before profiling.
        live, ids, sizes = self.s.live, self.s.block_ids, self.s.sizes
        unique = dict(payload)  # one storage may back several outputs (views, tuples)
        blocks = [live.get(p) for p in unique]
        return (tuple(ids[b] if b is not None else -p for p, b in zip(unique, blocks)),
                sum(sizes[b] if b is not None else n for b, n in zip(blocks, unique.values())))


# Keyed by int: marks read back from the journal carry plain ints (a Mark hashes as its value).
_MARK_HANDLERS: dict[int, Callable[[_Walker, int, int, Any], None]] = {
    Mark.FWD_ENTER: _Walker._fwd_enter,
    Mark.FWD_EXIT: _Walker._fwd_exit,
    Mark.BWD_ENTER: _Walker._bwd_enter,
    Mark.BWD_EXIT: _Walker._bwd_exit,
    Mark.BWD_END: _Walker._bwd_end,
    Mark.OPT_ENTER: _Walker._opt_enter,
    Mark.OPT_EXIT: _Walker._opt_exit,
}


#: The category a mark's storages are observed in: a model's inputs (the root's forward enter), the
#: feature maps modules return, and the gradients that flow through backward.
_MARK_ROLES: dict[int, int] = {Mark.FWD_ENTER: INPUTS, Mark.FWD_EXIT: FEATURE, Mark.BWD_ENTER: GRADS, Mark.BWD_EXIT: GRADS}


def sweep_reference(events: AllocationEvents, marks: list, observations: list, baseline_frees: list,
                    carried: Sequence[LiveBlock], parents: list[int], next_block_id: int, use_truth: bool) -> Sweep:
    """Walks one iteration in time order (see module docstring): the reference :func:`memprof.analysis.sweep.sweep` is
    tested against.

    Args:
        events: the allocator's events of the iteration.
        marks: the hooks' marks ``(ns, Mark, module, storages)``.
        observations: ``(ns, ptr, category code)``.
        baseline_frees: ``(ns, ptr)`` of pre-existing storages that died (CPU only).
        carried: blocks alive when the iteration started.
        parents: parent module index of each module (-1 for the root).
        next_block_id: first id to give a new block.
        use_truth: keep the allocator's running totals (CUDA, where they are absolute).
    """
    walker = _Walker(carried, parents, next_block_id)
    s = walker.s
    # Allocations and frees are nearly all the items; the phase and module they belong to change only
    # at marks, so those are read once per mark and the two hot paths below are inlined.
    live, sizes, block_ids, categories = s.live, s.sizes, s.block_ids, s.categories
    alloc_change, free_change = s.alloc_change, s.free_change
    c_block, c_sign, c_phase, c_module, c_truth = (s.change_block, walker.signs, walker.phases, walker.modules,
                                                   walker.truths)
    phase, module, in_forward = walker.phase, walker._module(), walker.phase == PHASE_FORWARD
    for t, _, _, kind, a, b, c in _merge(events, baseline_frees, observations, marks):
        if kind == "c":
            truth = c if use_truth else -1
            if b > 0:
                if a in live:  # the free was lost (e.g. during a restart gap): close the old block
                    walker.free(a, -1)
                block = len(sizes)
                block_ids.append(walker.next_block_id)
                walker.next_block_id += 1
                sizes.append(b)
                categories.append(-1)
                alloc_change.append(len(c_block))
                free_change.append(-1)
                live[a] = block
                sign = 1
                if in_forward:
                    walker.fwd_blocks.append(block)
            else:
                block = live.pop(a, -1)  # block indices are >= 0
                if block < 0:
                    continue
                free_change[block] = len(c_block)
                sign = -1
            c_block.append(block)
            c_sign.append(sign)
            c_phase.append(phase)
            c_module.append(module)
            c_truth.append(truth)
        elif kind == "f":
            walker.free(a, -1)
        elif kind == "o":
            walker.observe(a, b, c)
        else:
            walker.mark(t, a, b, c)
            phase, module, in_forward = walker.phase, walker._module(), walker.phase == PHASE_FORWARD
    result = walker.s
    result.categories = [OTHER if c < 0 else c for c in result.categories]
    result.next_block_id = walker.next_block_id
    return result
