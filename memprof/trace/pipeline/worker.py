"""The background worker: turns journal records into Parquet parts beside the training process.

Started by :class:`memprof.capture.sinks.BackgroundSink` as ``python -m memprof.trace.pipeline.worker <run_dir>``. It
reads one line per new record on stdin (``<iteration>``, or ``end`` when the profiler closes) and
answers one JSON line per processed iteration on stdout. It does not import torch, runs
at a lower priority than training, ignores Ctrl-C (the training process decides when to stop) and,
should the training process die, finishes every record already journaled before exiting.

Records are processed in gathers: once :data:`GATHER_RECORDS` are waiting, when the training process asks for
one at once (a report or a failure is due: ``<iteration> now``), or when no record came for :data:`_GATHER_S`.
Several records in a row run on warm caches and cost less than the same records one wake-up each.
Processed iterations are written in batches (:data:`FLUSH_ITERATIONS`, or whatever is ready when
training pauses); until then the journal holds them, and a reader finishes them itself. Before it exits the
worker sends ``{"stats": ...}``: the CPU seconds of its start and of each stage, for the benchmarks.
"""

from __future__ import annotations

import contextlib
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

#: Iterations written together as one Parquet part per table: parts cost mostly per file, not per row.
FLUSH_ITERATIONS = 16
#: Records the worker lets gather before it processes them (below ``sinks.MAX_PENDING``, so training never waits).
GATHER_RECORDS = 8
_GATHER_S = 0.2  # records waiting this long without a new one are processed
_IDLE_S = 0.5  # with no new record for this long, the worker writes what it has and checks its parent
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
    with contextlib.suppress(OSError):  # the training process is gone: the files are what matters now
        os.write(1, (json.dumps(message) + "\n").encode())


class _Worker:
    def __init__(self, run_dir: Path, stages: Stages | None = None) -> None:
        self.journal_dir = run_dir / JOURNAL_DIR
        self.stages = stages or Stages()
        state = read_state(self.journal_dir)
        self.processor = IterationProcessor(read_spec(self.journal_dir), state)
        self.reader = JournalReader(self.journal_dir, state.last_iteration)
        self.writer = TraceWriter(run_dir)
        self.batch: list[ProcessedIteration] = []
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

    def catch_up(self, through: int | None) -> None:
        """Processes the journaled records up to ``through`` (all there are: ``None``)."""
        stages = self.stages
        stages.lap(_WAKE)
        stages.counts["gathers"] += 1
        while through is None or self.reader.expected <= through:
            record = self.reader.next()
            stages.lap("journal read and decode")
            if record is None:
                break
            processed = self.processor.process(record)
            stages.lap("analysis")
            self.batch.append(processed)
            stages.counts["records"] += 1
            stages.counts["detailed"] += processed.detail
            _send({"done": processed.iteration, "report": processed.report, "failure": processed.failure,
                   "detailed": list(processed.detailed)})
            stages.lap("answers")
            if len(self.batch) >= FLUSH_ITERATIONS:
                self.flush()

    def flush(self) -> None:
        """Writes the processed iterations as one part per table, then the state that makes them final."""
        if not self.batch:
            return
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


def _gathers(parent: int) -> Iterator[int | None]:
    """The iteration to process through, once records have gathered (module docstring); ``None`` when idle.

    Reads stdin's lines (``<iteration>``, ``<iteration> now``, ``end``). Ends at EOF, ``end``, or the parent's
    death; the records still waiting then are the caller's to process.
    """
    waiting: int | None = None
    count = 0
    buffer = b""
    while True:
        ready = select.select([0], [], [], _GATHER_S if waiting is not None else _IDLE_S)[0]
        if not ready:
            if waiting is not None:
                yield waiting
                waiting, count = None, 0
                continue
            if os.getppid() != parent:  # re-parented: the training process died (a fork may hold our pipe)
                return
            yield None
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        now = False
        for line in complete:
            text = line.decode().strip()
            if text == "end":
                return
            if text:
                number, _, flag = text.partition(" ")
                waiting, count = int(number), count + 1
                now = now or flag == "now"
        if waiting is not None and (now or count >= GATHER_RECORDS):
            yield waiting
            waiting, count = None, 0


def main(argv: list[str] | None = None) -> int:
    """Runs the worker on the run directory named in ``argv``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(10)  # training comes first where the cores are busy
    try:
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        stages = Stages()
        stages.cpu_s["start"] = time.process_time()  # the interpreter and the imports; _Worker adds its set-up
        worker = _Worker(Path(args[0]), stages)
        for through in _gathers(parent):
            if through is not None:
                worker.catch_up(through)
            else:
                stages.counts["idle wake-ups"] += 1
                worker.flush()  # training paused or is slow: make what was processed readable as tables
        worker.catch_up(None)
        worker.flush()
        stages.lap(_WAKE)
        _send({"stats": stages.to_json()})
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
