"""Sinks that process records on the training thread: each iteration written as it comes, or journaled and
written in batches.

:class:`InlineSink` analyses and writes every record inside ``record_stats()``: a guarded run's (the guard reads
the carried state), and what a background sink falls back to when its worker or its journal fails.
:class:`JournaledSink` is what a background sink turns to when its worker only ever runs in time training would
use (:mod:`memprof.capture.sinks`): each record is journaled at once, analysed with the next few
(:data:`GATHER_RECORDS`: the first of a gather runs on caches a training step has emptied, the others on warm
ones, at half its time) and written with the next :data:`memprof.trace.pipeline.worker.FLUSH_ITERATIONS`
(Parquet costs per file, not per row: one iteration per part cost 2.5-3 ms a step). A training process that
dies leaves the journal, which the reader finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprof.analysis.iteration import IterationProcessor, ProcessedIteration
from memprof.analysis.records import IterationRecord
from memprof.trace.format.writer import TraceWriter, write_iterations
from memprof.trace.pipeline.journal import JournalWriter, write_state
from memprof.trace.pipeline.worker import FLUSH_ITERATIONS

#: Records a :class:`JournaledSink` analyses together (one at once where a report or a failure is due). On the
#: transformer of ``benchmarks/bench_profiler.py``, a steady record's analysis took 0.59 ms right after a training
#: step and 0.33 ms right after another record's.
GATHER_RECORDS = 8


@dataclass(frozen=True)
class Outcome:
    """What the training process learns about one processed iteration.

    Attributes:
        iteration: its number.
        report: its console report, when one was due.
        failure: post-mortem details, when it failed.
        write_error: why its parts could not be written, if they could not.
        detailed: the iterations whose detail was kept with it (itself, and the one before a failure).
        not_repeated: it ran without the submodules' hooks and did not repeat its template
            (:mod:`memprof.capture.steady` puts the hooks back).
    """

    iteration: int
    report: str | None = None
    failure: dict[str, Any] | None = None
    write_error: str | None = None
    detailed: tuple[int, ...] = ()
    not_repeated: bool = False


class InlineSink:
    """Processes and writes each record on the calling thread.

    Args:
        processor: analyses the records, carrying state between them.
        writer: writes the parts.
    """

    mode = "inline"

    def __init__(self, processor: IterationProcessor, writer: TraceWriter) -> None:
        self.processor, self.writer = processor, writer

    def submit(self, record: IterationRecord) -> list[Outcome]:
        """Processes ``record`` now."""
        processed = self.processor.process(record)
        error = None
        try:
            write_iterations(self.writer, [processed])
        except OSError as exc:
            error = str(exc)
        return [Outcome(record.iteration, processed.report, processed.failure, error, processed.detailed,
                        processed.not_repeated)]

    def allocated_bytes(self) -> int:
        """Bytes alive at the end of the last processed iteration."""
        return self.processor.state.allocated_bytes

    def finish(self) -> list[Outcome]:
        """Nothing is pending inline."""
        return []


class JournaledSink(InlineSink):
    """Journals each record, analyses it on the calling thread and writes the iterations in batches.

    Args:
        processor: analyses the records, carrying state between them.
        writer: writes the parts.
        journal: the run's journal (its open segment goes on).
        journal_dir: its folder, where the state after each batch is written.
    """

    def __init__(self, processor: IterationProcessor, writer: TraceWriter, journal: JournalWriter,
                 journal_dir: Path) -> None:
        super().__init__(processor, writer)
        self.journal: JournalWriter | None = journal
        self.journal_dir = journal_dir
        self.waiting: list[IterationRecord] = []  # journaled, not analysed yet
        self.batch: list[ProcessedIteration] = []  # analysed, not written yet

    def submit(self, record: IterationRecord) -> list[Outcome]:
        """Journals ``record``; analyses the records waiting once there are :data:`GATHER_RECORDS` of them, or a
        report or a failure is due; writes the batch when it is full."""
        if self.journal is None:
            return super().submit(record)
        try:
            self.journal.append(record)
        except OSError as exc:  # the journal cannot take it: what waits is written now, each record after it
            self.journal = None
            outcomes = self._analyse_waiting()
            flushed = self._flush()
            return [*outcomes, Outcome(record.iteration - 1, write_error=flushed or str(exc)), *super().submit(record)]
        self.waiting.append(record)
        now = self.processor.spec.answer_now(record)
        return self._analyse_waiting() if now or len(self.waiting) >= GATHER_RECORDS else []

    def _analyse_waiting(self) -> list[Outcome]:
        outcomes = []
        for record in self.waiting:
            processed = self.processor.process(record)
            self.batch.append(processed)
            error = self._flush() if len(self.batch) >= FLUSH_ITERATIONS else None
            outcomes.append(Outcome(record.iteration, processed.report, processed.failure, error, processed.detailed,
                                    processed.not_repeated))
        self.waiting = []
        return outcomes

    def _flush(self) -> str | None:
        """Writes the batch, then the state that makes it final (as the worker does); why it failed, if it did."""
        if not self.batch:
            return None
        batch, self.batch = self.batch, []
        try:
            write_iterations(self.writer, batch)
            write_state(self.journal_dir, self.processor.state)
        except OSError as exc:
            return str(exc)
        return None

    def finish(self) -> list[Outcome]:
        """Analyses what waits, writes what is batched and closes the journal (the caller removes it)."""
        outcomes = self._analyse_waiting()
        error = self._flush()
        if self.journal is not None:
            self.journal.close()
        return outcomes + ([Outcome(self.processor.state.last_iteration, write_error=error)] if error else [])


class DeadSink(InlineSink):
    """Stands in when nothing can be processed any more: records are dropped."""

    def __init__(self) -> None:  # noqa: D107 - nothing to set up
        pass

    def submit(self, record: IterationRecord) -> list[Outcome]:
        return []
