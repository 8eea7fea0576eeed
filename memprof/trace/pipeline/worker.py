"""The background worker: turns journal records into Parquet parts beside the training process.

Started by :class:`memprof.capture.sinks.BackgroundSink` as ``python -m memprof.trace.pipeline.worker <run_dir>``. It
reads a line on stdin when records wait (``<iteration>``: process through it; ``end`` when the profiler closes)
and answers one JSON line per processed iteration on stdout. It does not import torch, runs
at a lower priority than training, ignores Ctrl-C (the training process decides when to stop) and,
should the training process die, finishes every record already journaled before exiting.

Records are processed in gathers: the training process wakes the worker (a line ``<iteration>``) once
``sinks.WAKE_RECORDS`` records wait, or at once when a report or a failure is due, and the worker processes the
journal through that iteration. Several records in a row run on warm caches and cost less than the same records
one wake-up each. With no wake-up for :data:`_IDLE_S` it processes whatever is journaled (training slowed down),
and when there was nothing, writes what it has. Processed iterations are written in batches
(:data:`FLUSH_ITERATIONS`, or whatever is ready when training pauses); until then the journal holds them, and a
reader finishes them itself. Before it exits the
worker sends ``{"stats": ...}``: the CPU seconds of its start and of each stage, for the benchmarks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from memprof.analysis.iteration import IterationProcessor, ProcessedIteration
from memprof.trace.format.writer import TraceWriter, write_iterations
from memprof.trace.pipeline.journal import JOURNAL_DIR, JournalReader, read_spec, read_state, write_state

#: Iterations written together as one Parquet part per table: parts cost mostly per file, not per row (on the
#: saved transformer journal, 64 instead of 16 cut the flush's CPU from 0.24 to 0.17 ms a record). A worker idle
#: for :data:`_IDLE_S` writes what it has, so a run of slow steps is not left unwritten for 64 of them.
FLUSH_ITERATIONS = 64
_IDLE_S = 0.5  # with no wake-up for this long, the worker processes what is journaled, else writes what it has
_WAKE = "wake-ups (select, pipe)"


class Stages:
    """CPU seconds per stage of the worker's work, and counts (sent with ``{"stats": ...}`` at the end)."""

    def __init__(self) -> None:
        self.cpu_s: defaultdict[str, float] = defaultdict(float)
        self.counts: Counter[str] = Counter()
        self._at = time.process_time()

    def lap(self, stage: str) -> None:
        """Charges the CPU time since the last lap to ``stage``."""
        now = time.process_time()
        self.cpu_s[stage] += now - self._at
        self._at = now

    def to_json(self) -> dict[str, Any]:
        """The stages' CPU seconds and the counts, JSON-ready."""
        return {"cpu_s": dict(self.cpu_s), "counts": dict(self.counts)}


def _send(message: dict[str, Any]) -> None:
    _send_all([message])


def _send_all(messages: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(message) + "\n" for message in messages).encode()
    with contextlib.suppress(OSError):  # the training process is gone: the files are what matters now
        while data:
            data = data[os.write(1, data):]


class _Worker:
    def __init__(self, run_dir: Path, stages: Stages | None = None) -> None:
        self.journal_dir = run_dir / JOURNAL_DIR
        self.stages = stages or Stages()
        state = read_state(self.journal_dir)
        self.processor = IterationProcessor(read_spec(self.journal_dir), state)
        self.reader = JournalReader(self.journal_dir, state.last_iteration)
        self.writer = TraceWriter(run_dir)
        self.batch: list[ProcessedIteration] = []
        self.answers: list[dict[str, Any]] = []  # of processed records, not yet sent
        self._time_writes()
        self.stages.lap("start")

    def _time_writes(self) -> None:
        """Charges the writer's parts and merges to their own stages (the rest of a flush: building rows)."""
        writer, lap = self.writer, self.stages.lap
        append, compact = writer.append, writer.compact

        def timed_append(table: str, data: Any) -> Path | None:
            lap("flush: building rows")
            try:
                return append(table, data)
            finally:
                lap(f"flush: {table} part")

        def timed_compact() -> list[Path]:
            lap("flush: building rows")
            try:
                return compact()
            finally:
                lap("flush: compaction")

        writer.append, writer.compact = timed_append, timed_compact  # type: ignore[method-assign]

    def catch_up(self, through: int | None) -> int:
        """Processes the journaled records up to ``through`` (all there are: ``None``); returns how many."""
        stages = self.stages
        stages.lap(_WAKE)
        done = 0
        while through is None or self.reader.expected <= through:
            record = self.reader.next()
            stages.lap("journal read and decode")
            if record is None:
                break
            done += 1
            processed = self.processor.process(record)
            stages.lap("analysis")
            self.batch.append(processed)
            stages.counts["records"] += 1
            stages.counts["detailed"] += processed.detail
            self.answers.append({"done": processed.iteration, "report": processed.report,
                                 "failure": processed.failure, "detailed": list(processed.detailed),
                                 **({"not_repeated": True} if processed.not_repeated else {})})
            stages.lap("answers")
            if len(self.batch) >= FLUSH_ITERATIONS:
                self.flush()
        self.answer()
        stages.counts["gathers"] += done > 0
        return done

    def answer(self) -> None:
        """Sends the answers of the records processed so far, in one write (one read for the training process);
        the last carries the worker's CPU seconds so far (``cpu_s``: the training process weighs its waits by it)."""
        if self.answers:
            self.answers[-1]["cpu_s"] = time.process_time()
            _send_all(self.answers)
            self.answers = []
            self.stages.lap("answers")

    def flush(self) -> None:
        """Writes the processed iterations as one part per table, then the state that makes them final."""
        if not self.batch:
            return
        self.answer()  # training need not wait for the parts
        stages = self.stages
        stages.lap(_WAKE)
        stages.counts["flushes"] += 1
        try:
            write_iterations(self.writer, self.batch)
            write_state(self.journal_dir, self.processor.state)
            stages.lap("flush: state, journal clean-up")
        except OSError as exc:
            _send({"write_error": str(exc)})
        self.batch = []


def _wake_ups(parent: int) -> Iterator[int | None]:
    """The iteration to process through, each time the training process wakes the worker; ``None`` after
    :data:`_IDLE_S` without a wake-up.

    Reads stdin's lines (``<iteration>``, or ``end``). Ends at EOF, ``end``, or the parent's death; the records
    still waiting then are the caller's to process.
    """
    buffer = b""
    while True:
        if not select.select([0], [], [], _IDLE_S)[0]:
            if os.getppid() != parent:  # re-parented: the training process died (a fork may hold our pipe)
                return
            yield None
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        through = None
        for line in complete:
            text = line.decode().strip()
            if text == "end":
                return
            if text:
                through = int(text.partition(" ")[0])
        if through is not None:
            yield through


#: Environment variable naming the worker's scheduling priority: ``idle`` (Linux's SCHED_IDLE) or ``nice:<n>``.
PRIORITY_ENV = "MEMPROF_WORKER_PRIORITY"
#: Where torch's threads keep every core busy, the worker at SCHED_IDLE runs in the gaps they leave and preempts
#: none of them; at ``nice 0-19`` it did, and the steps took longer (docs/benchmarks.md, section 1d).
DEFAULT_PRIORITY = "idle"


def lower_priority(wanted: str | None = None) -> str:
    """Lowers this process's scheduling priority, as ``wanted`` (default: :data:`PRIORITY_ENV`, else
    :data:`DEFAULT_PRIORITY`) says; returns what was done, for the worker's account.

    ``idle``: Linux's SCHED_IDLE: the worker runs on a core that nothing else wants, and training never waits for
    a core because of it (``nice:19`` where there is no SCHED_IDLE or it is refused). ``nice:<n>``: that niceness.
    An unknown value stands for the default. Either lasts: an unprivileged process cannot raise its priority again.
    """
    wanted = wanted or os.environ.get(PRIORITY_ENV) or DEFAULT_PRIORITY
    if wanted != "idle" and not (wanted.startswith("nice:") and wanted[5:].isdigit()):
        wanted = DEFAULT_PRIORITY
    if wanted == "idle":
        idle = getattr(os, "SCHED_IDLE", None)
        if idle is not None:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, idle, os.sched_param(0))
                return "idle"
        wanted = "nice:19"
    with contextlib.suppress(OSError):
        os.nice(int(wanted[5:]))
        return wanted
    return "unchanged"


def main(argv: list[str] | None = None) -> int:
    """Runs the worker on the run directory named in ``argv``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    priority = lower_priority()  # training comes first where the cores are busy
    try:
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        stages = Stages()
        stages.cpu_s["start"] = time.process_time()  # the interpreter and the imports; _Worker adds its set-up
        worker = _Worker(Path(args[0]), stages)
        gc.freeze()  # the modules' objects, imported once: later collections need not walk them
        for through in _wake_ups(parent):
            if through is not None:
                worker.catch_up(through)
            elif not worker.catch_up(None):  # records it was not woken for yet are processed first
                stages.counts["idle wake-ups"] += 1
                worker.flush()  # training paused: make what was processed readable as tables
        worker.catch_up(None)
        worker.flush()
        stages.lap(_WAKE)
        _send({"stats": {**stages.to_json(), "priority": priority}})
    except Exception as exc:  # noqa: BLE001 - whatever it is, the training process must hear of it
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    # Everything is written and answered by now: skipping the interpreter's teardown (numpy's and pyarrow's
    # modules, the analysis' objects) saves 20-40 ms of CPU per run.
    status = main()
    sys.stdout.flush()
    os._exit(status)
