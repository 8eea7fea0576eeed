"""The background worker: turns journal records into Parquet parts beside the training process.

Started by :class:`memprof.capture.sinks.BackgroundSink` as ``python -m memprof.trace.worker <run_dir>``. It
reads one line per new record on stdin (``<iteration>``, or ``end`` when the profiler closes) and
answers one JSON line per processed iteration on stdout. It does not import torch, runs
at a lower priority than training, ignores Ctrl-C (the training process decides when to stop) and,
should the training process die, finishes every record already journaled before exiting.

Processed iterations are written in batches (:data:`FLUSH_ITERATIONS`, or whatever is ready when
training pauses); until then the journal holds them, and a reader finishes them itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from memprof.analysis.iteration import IterationProcessor, ProcessedIteration
from memprof.trace.journal import JOURNAL_DIR, JournalReader, read_spec, read_state, write_state
from memprof.trace.writer import TraceWriter, write_iterations

#: Iterations written together as one Parquet part per table: parts cost mostly per file, not per row.
FLUSH_ITERATIONS = 16
_IDLE_S = 0.5  # with no new record for this long, the worker writes what it has and checks its parent


def _send(message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the training process is gone: the files are what matters now
        os.write(1, (json.dumps(message) + "\n").encode())


class _Worker:
    def __init__(self, run_dir: Path) -> None:
        self.journal_dir = run_dir / JOURNAL_DIR
        state = read_state(self.journal_dir)
        self.processor = IterationProcessor(read_spec(self.journal_dir), state)
        self.reader = JournalReader(self.journal_dir, state.last_iteration)
        self.writer = TraceWriter(run_dir)
        self.batch: list[ProcessedIteration] = []

    def catch_up(self, through: int | None) -> None:
        """Processes the journaled records up to ``through`` (all there are: ``None``)."""
        while through is None or self.reader.expected <= through:
            record = self.reader.next()
            if record is None:
                break
            processed = self.processor.process(record)
            self.batch.append(processed)
            _send({"done": processed.iteration, "report": processed.report, "failure": processed.failure,
                   "detailed": list(processed.detailed)})
            if len(self.batch) >= FLUSH_ITERATIONS:
                self.flush()

    def flush(self) -> None:
        """Writes the processed iterations as one part per table, then the state that makes them final."""
        if not self.batch:
            return
        try:
            write_iterations(self.writer, self.batch)
            write_state(self.journal_dir, self.processor.state)
        except OSError as exc:
            _send({"write_error": str(exc)})
        self.batch = []


def _lines(parent: int) -> Iterator[str]:
    """Lines from stdin, ``""`` when none came for a while; ends at EOF, ``end``, or the parent's death."""
    buffer = b""
    while True:
        ready = select.select([0], [], [], _IDLE_S)[0]
        if not ready:
            if os.getppid() != parent:  # re-parented: the training process died (a fork may hold our pipe)
                return
            yield ""
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            text = line.decode().strip()
            if text == "end":
                return
            if text:
                yield text


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
        worker = _Worker(Path(args[0]))
        for line in _lines(parent):
            if line:
                worker.catch_up(int(line))
            else:
                worker.flush()  # training paused or is slow: make what was processed readable as tables
        worker.catch_up(None)
        worker.flush()
    except Exception as exc:  # noqa: BLE001 - whatever it is, the training process must hear of it
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
