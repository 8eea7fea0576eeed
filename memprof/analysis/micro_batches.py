"""Gradient accumulation: an iteration split into micro-batches, each a forward followed by its backward.

A training loop that accumulates gradients runs the model's forward and backward k times and steps the
optimizer once; with ``record_stats()`` called once per optimizer step, one iteration of the trace holds k
forward/backward pairs. Summed over them, a module's sizes and times would be k times one call's (and every
module would look shared, called k times), so the per-layer rows describe one micro-batch instead: the last
one, whose forward runs with the gradients of the earlier ones held and whose backward adds to them in place,
like every micro-batch after the first (the steady state, and where the step's peak lies). The iteration's
peak and its categories stay the whole step's, across micro-batches.

The pattern is recognised from the hook marks alone: the root module's forward ran k >= 2 times (outermost
calls), and each of them was followed by backward marks before the next one began (and the last before the
iteration ended). A model called twice before one backward (two views of a batch, an evaluation forward
under ``no_grad``) is not split. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memprof.analysis.attribution import Call
from memprof.analysis.records import Mark

_BACKWARD = frozenset({int(Mark.BWD_ENTER), int(Mark.BWD_EXIT), int(Mark.BWD_END)})
_ROOT = 0  # the profiled model is module 0


@dataclass(frozen=True)
class MicroBatches:
    """How an iteration divides into micro-batches.

    Attributes:
        count: k, the forward/backward pairs of the root module; 1 when the iteration is not split.
        last_mark: index, in the sweep's marks, of the root forward enter that began the last micro-batch
            (0 when ``count`` is 1: the whole iteration).
    """

    count: int = 1
    last_mark: int = 0


def micro_batches(marks: Sequence[tuple[int, int, int, int, int]]) -> MicroBatches:
    """Finds gradient accumulation in an iteration's marks.

    Args:
        marks: the sweep's marks in order, ``(time_ns, kind, module, change, phase)``
            (:attr:`memprof.analysis.attribution.Sweep.marks`).
    """
    starts: list[int] = []  # mark index of each outermost root forward enter
    followed: list[bool] = []  # whether backward marks came after that forward, before the next
    depth = 0
    for index, (_, kind, module, _, _) in enumerate(marks):
        if module == _ROOT and kind == Mark.FWD_ENTER:
            if depth == 0:
                starts.append(index)
                followed.append(False)
            depth += 1
        elif module == _ROOT and kind == Mark.FWD_EXIT:
            depth = max(depth - 1, 0)
        elif kind in _BACKWARD and depth == 0 and followed:
            followed[-1] = True
    if len(starts) < 2 or not all(followed):
        return MicroBatches()
    return MicroBatches(len(starts), starts[-1])


def in_last(calls: list[Call], split: MicroBatches) -> list[Call]:
    """The calls that began in the last micro-batch (all of them when the iteration is not split).

    A call belongs to the micro-batch whose root forward enter came before the mark that began it, so a
    recomputation in the previous micro-batch's backward (a checkpointed block's forward) stays there.
    """
    if split.count == 1:
        return calls
    return [call for call in calls if call.start_mark >= split.last_mark]
