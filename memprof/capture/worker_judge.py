"""Whether the background worker only runs in time training would otherwise use: the rule that hands its records
to the training thread.

The worker runs at SCHED_IDLE, on a core nothing else wants (:mod:`memprof.trace.pipeline.worker`). Where training
keeps every core busy (torch's intra-op threads spin between operations on a CPU run at torch's default
threads), it runs almost only while ``record_stats()`` waits for it, and a second process then costs more than it
saves (its journal reads, its pipe, caches a training step has emptied). A :class:`WorkerJudge` weighs training's
waits against the worker's CPU over windows of answered records; where training waited at least
:data:`INLINE_WAIT_SHARE` of it, :class:`memprof.capture.sinks.BackgroundSink` stops the worker and analyses the
records itself (docs/profiler.md, *Where the work happens*). Pure: it is told the waits, the answers and the
worker's CPU, and decides nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Records the worker answers before it is judged: its start and the detailed first iterations say nothing of a
#: steady record's cost.
SETTLE_RECORDS = 16
#: Records a judged window holds.
JUDGE_RECORDS = 32
#: Training waited at least this share of the worker's CPU over a window: the worker runs in time training would
#: otherwise use (docs/benchmarks.md, section 1: on this project's 2-core machine at torch's default threads
#: training waited 0.5 ms a step for a worker's 0.6 ms). ``math.inf``: never; 0: at the first window.
INLINE_WAIT_SHARE = 0.5


@dataclass(frozen=True)
class Switch:
    """Why and when the records went from the worker to the training thread (``meta.json``'s
    ``processing_switch``).

    Attributes:
        iteration: the first iteration the training thread processes.
        records: the records of the window judged.
        worker_cpu_ms: the worker's CPU over them.
        waited_ms: training's waits for the worker over them.
    """

    iteration: int
    records: int
    worker_cpu_ms: float
    waited_ms: float

    def to_meta(self) -> dict[str, Any]:
        """The ``meta.json`` value."""
        return {"iteration": self.iteration, "records": self.records, "worker_cpu_ms": round(self.worker_cpu_ms, 2),
                "waited_ms": round(self.waited_ms, 2)}


class WorkerJudge:
    """Training's waits and the worker's CPU over windows of :data:`JUDGE_RECORDS` answered records (the module's
    constants are read at each call, so that a test or a benchmark may set them)."""

    def __init__(self) -> None:
        self._from: tuple[int, float] | None = None  # records answered and the worker's CPU at the window's start
        self._waited_s = 0.0

    def waited(self, seconds: float) -> None:
        """Training waited ``seconds`` for the worker."""
        self._waited_s += seconds

    def verdict(self, answered: int, worker_cpu_s: float, iteration: int) -> Switch | None:
        """After ``iteration``'s record, with ``answered`` records answered and ``worker_cpu_s`` of the worker's
        CPU so far: the switch to make, where the window just judged says so; else ``None``."""
        if answered < SETTLE_RECORDS:
            return None
        if self._from is None:
            self._from, self._waited_s = (answered, worker_cpu_s), 0.0
            return None
        start, start_cpu_s = self._from
        records, worker_s = answered - start, worker_cpu_s - start_cpu_s
        if records < JUDGE_RECORDS:
            return None
        self._from = None  # the next record opens the next window
        if worker_s <= 0 or self._waited_s < INLINE_WAIT_SHARE * worker_s:
            return None
        return Switch(iteration=iteration + 1, records=records, worker_cpu_ms=1e3 * worker_s,
                      waited_ms=1e3 * self._waited_s)
