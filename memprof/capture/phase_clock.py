"""Times each iteration's forward and backward between the root module's marks (see
:mod:`memprof.analysis.phase_times`), on the host's clock and, on CUDA, on the device's.

On CUDA a timing CUDA event is recorded at each root mark (three a step: the kernels are not waited for), and an
iteration's device times are read once its last event has completed: :meth:`PhaseClock.poll` asks without
waiting, :meth:`PhaseClock.finish` waits when the profiler closes. ``record_stats()`` only hands each iteration's
marks over (:meth:`PhaseClock.end_iteration`); they are read at the next poll, every few iterations, where the
code that reads them runs on warm caches (right after a training step, each Python call costs several times as
much).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from memprof.analysis.phase_times import PhaseTime, phase_times_to_meta
from memprof.analysis.records import Mark, MarkRow

__all__ = ["PhaseClock", "last_pass"]

#: Resolved phase times kept for ``meta.json``: the planner scales the latest hooked iterations' layer times by
#: the steady iterations' times.
KEEP_HOOKED = 32
KEEP_STEADY = 64

_ENTER, _EXIT, _END = Mark.FWD_ENTER, Mark.FWD_EXIT, Mark.BWD_END


class _Pending(NamedTuple):
    iteration: int
    steady: bool
    host_ms: tuple[float, float]
    events: tuple[Any, Any, Any]  # torch.cuda.Event at the forward's start, its end, the backward's end


def last_pass(marks: Sequence[MarkRow]) -> tuple[list[int], tuple[int, int, int]] | None:
    """The positions of the root's marks (forward enter and exit, backward end) among ``marks``, and which
    of those are the last forward's enter and exit and the backward end after it; ``None`` when the iteration
    has no such forward and backward (an evaluation step, a failed one)."""
    roots = [i for i, m in enumerate(marks) if (m[2] == 0 and m[1] in (_ENTER, _EXIT)) or m[1] == _END]
    kinds = [marks[i][1] for i in roots]
    for enter in range(len(kinds) - 1, -1, -1):
        if kinds[enter] != _ENTER:
            continue
        exit_ = next((j for j in range(enter + 1, len(kinds)) if kinds[j] == _EXIT), None)
        end = next((j for j in range(enter + 1, len(kinds)) if kinds[j] == _END), None)
        if exit_ is not None and end is not None and exit_ < end:
            return roots, (enter, exit_, end)
    return None


class PhaseClock:
    """The phase times of a run's iterations.

    Args:
        cuda: time on the device's clock with CUDA events too (the model runs on a GPU).
    """

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._events: list[Any] = []  # this iteration's events, one per root mark
        self._ended: list[tuple[int, bool, Sequence[MarkRow], list[Any]]] = []  # iterations not read yet
        self._pending: deque[_Pending] = deque()
        self._hooked: deque[PhaseTime] = deque(maxlen=KEEP_HOOKED)
        self._steady: deque[PhaseTime] = deque(maxlen=KEEP_STEADY)

    def stamp(self) -> None:
        """Called at each root mark as it is made: records the device's clock there (nothing on a CPU)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)

    def end_iteration(self, iteration: int, marks: Sequence[MarkRow], steady: bool) -> None:
        """Keeps the iteration's marks (and events), whose times the next :meth:`poll` takes (``marks`` must not
        change meanwhile: a drained list, which the hooks no longer append to)."""
        self._ended.append((iteration, steady, marks, self._events))
        self._events = []

    def _read(self, iteration: int, steady: bool, marks: Sequence[MarkRow], events: list[Any]) -> None:
        """Takes an iteration's times from its marks (and events)."""
        found = last_pass(marks)
        if found is None:
            return
        roots, (enter, exit_, end) = found
        times = [marks[roots[k]][0] for k in (enter, exit_, end)]
        host = ((times[1] - times[0]) / 1e6, (times[2] - times[1]) / 1e6)
        if not self.cuda:
            self._add(PhaseTime(iteration=iteration, steady=steady, host_forward_ms=host[0],
                                host_backward_ms=host[1], forward_ms=host[0], backward_ms=host[1]))
        elif len(events) == len(roots):  # else a mark was made where no event could be (a compiled region)
            self._pending.append(_Pending(iteration, steady, host, (events[enter], events[exit_], events[end])))

    def poll(self, wait: bool = False) -> None:
        """Reads the times of the iterations ended since the last poll, and the device times of those whose kernels
        have finished (all of them with ``wait``)."""
        ended, self._ended = self._ended, []
        for iteration, steady, marks, events in ended:
            self._read(iteration, steady, marks, events)
        while self._pending and (wait or self._pending[0].events[2].query()):
            item = self._pending.popleft()
            start, middle, end = item.events
            end.synchronize()
            self._add(PhaseTime(iteration=item.iteration, steady=item.steady, host_forward_ms=item.host_ms[0],
                                host_backward_ms=item.host_ms[1], forward_ms=max(start.elapsed_time(middle), 0.0),
                                backward_ms=max(middle.elapsed_time(end), 0.0)))

    def finish(self) -> dict[str, Any]:
        """Waits for the last iterations' kernels; ``meta.json``'s ``phase_times``."""
        self.poll(wait=True)
        return self.to_meta()

    def to_meta(self) -> dict[str, Any]:
        """``meta.json``'s ``phase_times`` for the iterations resolved so far."""
        return phase_times_to_meta("cuda" if self.cuda else "host", [*self._hooked, *self._steady])

    @property
    def resolved(self) -> int:
        """How many iterations' times are kept."""
        return len(self._hooked) + len(self._steady)

    def _add(self, time: PhaseTime) -> None:
        (self._steady if time.steady else self._hooked).append(time)
