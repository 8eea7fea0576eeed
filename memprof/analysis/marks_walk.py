"""What the sweep's mark handlers decide from the marks alone: the phase and module each mark leaves, where the
root's forward ran and ended, which modules' forward calls returned, and the micro-batches.

:mod:`memprof.analysis.summary` reads these instead of sweeping; a training loop repeats its marks' sequence
(their kinds, modules and places among the events), so :class:`MarksCache` walks each sequence once. The walk is
the sweep's own walker (:class:`memprof.analysis.sweep._SegmentWalker`) given marks and no events, so the rules are
the sweep's. Torch-free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memprof.analysis.attribution import PHASE_FORWARD
from memprof.analysis.micro_batches import micro_batches
from memprof.analysis.sweep import _SegmentWalker


@dataclass(frozen=True)
class MarksFacts:
    """What the sweep's mark handlers decide from the marks' kinds, modules and places alone.

    Attributes:
        bounds: the events before each mark.
        phases: phase code after each mark.
        modules: module index after each mark (-1: none).
        forward_events: the events the root's forward ran over, where it ended (the forward's rule: what it made
            and left alive at its end is a feature map).
        forward_ends: for each of them, the events before that forward's end.
        forward_modules: modules whose forward call returned (those the run orders by first call).
        micro_batches: :func:`memprof.analysis.micro_batches.micro_batches`' count.
    """

    bounds: np.ndarray
    phases: np.ndarray
    modules: np.ndarray
    forward_events: np.ndarray
    forward_ends: np.ndarray
    forward_modules: frozenset[int]
    micro_batches: int


class _MarksWalk(_SegmentWalker):
    """The sweep's walker given marks and no events: what its forward ran over are events, not blocks."""

    def __init__(self, parents: list[int]) -> None:
        super().__init__([], parents, 0, 0)
        self.bound = 0
        self.forward_events: list[int] = []
        self.forward_ends: list[int] = []

    def _end_forward(self) -> None:
        self.forward_events.extend(self.fwd_blocks)
        self.forward_ends.extend([self.bound] * len(self.fwd_blocks))
        self.fwd_blocks = []
        super()._end_forward()


def marks_facts(kinds: Sequence[int], modules: Sequence[int], bounds: Sequence[int], parents: list[int]) -> MarksFacts:
    """Walks the marks (kinds, modules, events before each) through the sweep's handlers."""
    walker = _MarksWalk(parents)
    phases, after = [], []
    previous = 0
    for kind, module, bound in zip(kinds, modules, bounds):
        if walker.phase == PHASE_FORWARD and bound > previous:
            walker.fwd_blocks.extend(range(previous, bound))
        walker.bound = previous = bound
        walker.mark(0, kind, module, ())
        phases.append(walker.phase)
        after.append(walker._module())
    return MarksFacts(np.asarray(bounds, dtype=np.int64), np.asarray(phases, dtype=np.int64),
                      np.asarray(after, dtype=np.int64), np.asarray(walker.forward_events, dtype=np.int64),
                      np.asarray(walker.forward_ends, dtype=np.int64),
                      frozenset(call.module for call in walker.s.forward_calls), micro_batches(walker.s.marks).count)


class MarksCache:
    """:func:`marks_facts` for the last few sequences of marks seen (a training loop repeats one or two)."""

    def __init__(self, parents: list[int], size: int = 4) -> None:
        self.parents, self.size = parents, size
        self._found: OrderedDict[bytes, MarksFacts] = OrderedDict()
        # the last answer, by the identity of its kinds and modules (a template plan's arrays) and its bounds' bytes:
        # a steady record's look-up without building the key
        self._last: tuple[np.ndarray, np.ndarray, bytes, MarksFacts] | None = None

    def facts(self, kinds: np.ndarray, modules: np.ndarray, bounds: np.ndarray) -> MarksFacts:
        """The facts of these marks (int64 arrays), walked once per distinct sequence."""
        last, placed = self._last, bounds.tobytes()
        if last is not None and last[0] is kinds and last[1] is modules and last[2] == placed:
            return last[3]
        found = self._walked(kinds, modules, bounds)
        self._last = (kinds, modules, placed, found)
        return found

    def _walked(self, kinds: np.ndarray, modules: np.ndarray, bounds: np.ndarray) -> MarksFacts:
        key = np.concatenate([kinds, modules, bounds]).tobytes()
        found = self._found.get(key)
        if found is None:
            found = marks_facts(kinds.tolist(), modules.tolist(), bounds.tolist(), self.parents)
            self._found[key] = found
            if len(self._found) > self.size:
                self._found.popitem(last=False)
        else:
            self._found.move_to_end(key)
        return found
