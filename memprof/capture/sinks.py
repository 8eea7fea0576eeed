"""Where ``record_stats()`` sends an iteration's record: processed inline, or by a background worker.

:class:`BackgroundSink` only journals the raw record (a fraction of a ms) and lets
:mod:`memprof.trace.pipeline.worker`, a separate process so that it never competes for the GIL, do the rest, on
a core training leaves idle. Where training leaves none (torch's intra-op threads on every core, as on a CPU
run with torch's default threads), the worker runs only while training waits for it, and a second process's
journal reads, pipe and cold caches cost more than the analysis on the training thread: once training waited
long enough for it (:mod:`memprof.capture.worker_judge`), the worker finishes what is journaled and stops, and the records go on to a :class:`memprof.capture.inline_sinks.JournaledSink`
(journaled, analysed in gathers, written in batches). Should the worker stop, or a record fail to reach the
disk, the sink takes over inline from the worker's last saved state, so no completed iteration is lost and
attribution stays exact.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, NamedTuple

from memprof.analysis.iteration import IterationProcessor
from memprof.analysis.records import CarriedState, IterationRecord, RunSpec
from memprof.capture.inline_sinks import DeadSink, InlineSink, JournaledSink, Outcome
from memprof.capture.worker_judge import Switch, WorkerJudge
from memprof.errors import CorruptTraceError
from memprof.trace.format.writer import TraceWriter
from memprof.trace.pipeline.journal import (
    JOURNAL_DIR,
    JournalReader,
    JournalWriter,
    read_state,
    write_spec,
    write_state,
)

__all__ = ["MAX_PENDING", "WAKE_RECORDS", "BackgroundSink", "InlineSink", "JournaledSink", "Outcome", "Switch"]

#: Records the worker may fall behind by before ``record_stats()`` waits for it (bounds disk and close time).
MAX_PENDING = 16
#: The worker is woken (one line on its stdin) once this many records wait, or at once when a report or a failure
#: is due; below ``MAX_PENDING``, so training never waits for it. Several records in a row run on warm caches, and
#: a wake-up costs both processes a pipe write, a read and a scheduler switch.
WAKE_RECORDS = 8
_STALL_S = 120.0  # a worker silent this long while owing answers is taken for hung
#: While training waits for the worker's answers: how long the worker may run no CPU time at all before the training
#: thread takes its records over. At idle priority it gets none while other processes keep every core busy (a
#: shared machine; two test suites side by side: training waited the whole 120 s stall each time, then took over).
STARVED_S = 5.0
_POLL_S = 1.0  # how often a waiting training thread reads the worker's CPU time
# Answers are short lines: a small read size keeps os.read from allocating (and faulting in) 64 KiB each step.
_READ_BYTES = 4096


def _worker_env() -> dict[str, str]:
    # The worker must import this very memprof, even when it is not installed (a checkout on sys.path).
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "OMP_NUM_THREADS": "1"}


def _cpu_ticks(pid: int) -> int | None:
    """The process's user and system CPU time so far, in clock ticks (``/proc/<pid>/stat``); ``None`` where unread."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime and stime, the stat line's 14th and 15th fields
    except (OSError, ValueError, IndexError):
        return None


class _Worker(NamedTuple):
    """The worker process and its two pipes (typed as present: it is always started with both)."""

    process: subprocess.Popen[bytes]
    stdin: IO[bytes]
    stdout: IO[bytes]


class BackgroundSink:
    """Journals each record and has the background worker process it.

    Args:
        run_dir: the run's directory.
        spec: the run's static facts.
        state: the state before the first record.

    Raises:
        OSError: the journal or the worker could not be set up (the caller then goes inline).
    """

    def __init__(self, run_dir: Path, spec: RunSpec, state: CarriedState) -> None:
        self.run_dir = Path(run_dir)
        self.journal_dir = self.run_dir / JOURNAL_DIR
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        write_spec(self.journal_dir, spec)
        write_state(self.journal_dir, state)
        self._spec = spec
        self._inline: InlineSink | None = None
        self._journal = JournalWriter(self.journal_dir)
        self._submitted = self._answered = 0
        self._last = self._told = -1  # the last iteration journaled, and the last the worker was woken for
        self._reported = -1  # the last iteration whose outcome the caller has had
        self._buffer = b""
        self._eof = False
        self._error: str | None = None
        self._proc: _Worker | None = None  # started with the first record: attach/close costs nothing
        #: Why the worker stopped, once it did (the caller warns once).
        self.stopped: str | None = None
        #: What the worker's CPU went to, per stage, once it ended (``memprof.trace.pipeline.worker.Stages``).
        self.worker_stats: dict[str, Any] | None = None
        #: Why and when the records went to the training thread, once training waited for the worker.
        self.switched: Switch | None = None
        self._worker_cpu_s = 0.0  # the worker's CPU seconds, as its last answers said
        self._judge = WorkerJudge()

    def _start(self) -> _Worker:
        # Its own process group keeps a terminal's Ctrl-C away from it; the training process's session keeps it in
        # the same scheduler autogroup (Linux groups tasks by session), where its low priority counts against
        # training's threads: from a session of its own it competed with the whole training process as an equal.
        command = [sys.executable, "-m", "memprof.trace.pipeline.worker", str(self.run_dir)]
        if sys.version_info >= (3, 11):
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env=_worker_env(), process_group=0)
        else:  # pragma: no cover - Python 3.10 has no process_group (and preexec_fn is unsafe with torch's threads)
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env=_worker_env(), start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None  # both are pipes (PIPE above)
        os.set_blocking(proc.stdout.fileno(), False)
        return _Worker(proc, proc.stdin, proc.stdout)

    def _running(self) -> _Worker:
        if self._proc is None:
            raise RuntimeError("memprof's worker was asked for before it was started")  # a bug, not bad input
        return self._proc

    @property
    def pid(self) -> int | None:
        """The worker's process id (``None`` before the first record)."""
        return self._proc.process.pid if self._proc is not None else None

    @property
    def mode(self) -> str:
        """``background`` while the worker runs, ``inline`` after it stopped."""
        return "inline" if self._inline is not None else "background"

    def submit(self, record: IterationRecord) -> list[Outcome]:
        """Journals ``record`` and hands it to the worker; returns what the worker answered meanwhile."""
        if self._inline is not None:
            return self._inline.submit(record)
        if self._proc is None:
            try:
                self._proc = self._start()
            except OSError as exc:
                return self._take_over(f"it could not be started: {exc}", record)
        # Answers come only for records the worker was told to process: with all of those answered, there is
        # nothing to read (a worker gone meanwhile is found at the next wake-up, its last words read then).
        outcomes = self._read(block=False) if self._reported < self._told else []
        if self._inline is not None:  # the worker was found gone (and taken over) just now
            return outcomes + self._inline.submit(record)
        try:
            self._journal.append(record)
        except OSError as exc:
            # The journal cannot take it (disk full, folder gone): go on inline from the worker's state.
            lost = Outcome(record.iteration, write_error=str(exc))
            return outcomes + self._take_over(None, record) + [lost]
        self._submitted += 1
        self._last = record.iteration
        # the worker is woken once a few records wait, unless something is to be shown now
        if self._spec.answer_now(record) or record.iteration - self._told >= WAKE_RECORDS:
            outcomes += self._wake(record.iteration)
        if self._inline is None and self._submitted - self._answered > MAX_PENDING:
            started = time.perf_counter()
            while self._inline is None and self._submitted - self._answered > MAX_PENDING:
                outcomes += self._read(block=True)
            self._judge.waited(time.perf_counter() - started)
        if self._inline is None and (switch := self._judge.verdict(self._answered, self._worker_cpu_s,
                                                                   record.iteration)) is not None:
            self.switched = switch
            outcomes += self._go_inline()
        return outcomes

    def _go_inline(self) -> list[Outcome]:
        """The worker processes what is journaled and exits; the records after it are journaled, analysed and
        written in batches on the training thread (:class:`JournaledSink`), from the state it saved."""
        outcomes = self._end_worker()
        if self._inline is not None:  # it failed on the way out, and was taken over
            return outcomes
        try:
            state = read_state(self.journal_dir)
        except (OSError, CorruptTraceError) as exc:
            return outcomes + self._take_over(f"its saved state is unreadable ({exc})")
        if state.last_iteration != self._last:  # it exited cleanly: everything journaled is written
            return outcomes + self._take_over(f"it wrote through iteration {state.last_iteration}, not {self._last}")
        self._inline = JournaledSink(IterationProcessor(self._spec, state), TraceWriter(self.run_dir), self._journal,
                                     self.journal_dir)
        return outcomes

    def _end_worker(self) -> list[Outcome]:
        """Has the worker process every journaled record and exit; waits for it (taking over if it failed)."""
        worker, outcomes = self._running(), []
        self._told = self._last  # "end": the worker processes every journaled record before it exits
        try:
            worker.stdin.write(b"end\n")
            worker.stdin.close()
        except OSError:
            pass
        while self._inline is None and not self._eof:
            outcomes += self._read(block=True)
        if self._inline is None and (worker.process.wait() != 0 or self._error):
            # it answered everything but failed before its last batch was written: redo that inline
            outcomes += self._take_over(self._why_stopped())
        self._reap()
        return outcomes

    def _wake(self, through: int) -> list[Outcome]:
        """Tells the worker to process the journal through iteration ``through``."""
        self._told = through
        try:
            self._running().stdin.write(f"{through}\n".encode())
            self._running().stdin.flush()
        except OSError:
            outcomes = self._read(block=False)  # what it said before it went (an error), and its end
            return outcomes if self._inline is not None else outcomes + self._take_over(self._why_stopped())
        return []

    def finish(self) -> list[Outcome]:
        """Waits for the worker to process every record, stops it and removes the journal."""
        outcomes: list[Outcome] = []
        if self._inline is None and self._proc is not None:
            outcomes += self._end_worker()
        if self._inline is not None:  # what a journaled sink has batched is written before the journal goes
            outcomes += self._inline.finish()
        self._journal.close()
        shutil.rmtree(self.journal_dir, ignore_errors=True)
        return outcomes

    # ------------------------------------------------------------------ talking to the worker
    def _read(self, block: bool) -> list[Outcome]:
        """Answers available now; with ``block``, wakes the worker and waits until some come (or the worker ends)."""
        fd = self._running().stdout.fileno()
        if block and not self._eof and self._told < self._last:
            taken = self._wake(self._last)
            if self._inline is not None:  # it could not be woken: taken over
                return taken
        if block and (silent := self._wait_for_answer(fd)) is not None:
            return self._take_over(silent)
        outcomes: list[Outcome] = []
        while not self._eof:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                self._eof = True
                break
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "error" in message:
                    self._error = str(message["error"])
                elif "stats" in message:
                    self.worker_stats = message["stats"]
                elif "write_error" in message:
                    outcomes.append(Outcome(self._reported, write_error=str(message["write_error"])))
                else:
                    self._answered += 1
                    self._reported = int(message["done"])
                    self._worker_cpu_s = float(message.get("cpu_s", self._worker_cpu_s))
                    outcomes.append(Outcome(self._reported, message.get("report"), message.get("failure"),
                                            detailed=tuple(message.get("detailed", ())),
                                            not_repeated=bool(message.get("not_repeated", False))))
        if self._eof and self._answered < self._submitted:
            return outcomes + self._take_over(self._why_stopped())
        return outcomes

    def _wait_for_answer(self, fd: int) -> str | None:
        """Waits until the worker says something; ``None`` then, else why it is given up: silent for
        :data:`_STALL_S`, or running no CPU time for :data:`STARVED_S` (read from ``/proc``, where there is one)."""
        pid = self._running().process.pid
        started = progressed = time.monotonic()
        ticks = _cpu_ticks(pid)
        while not select.select([fd], [], [], _POLL_S)[0]:
            now = time.monotonic()
            if now - started >= _STALL_S:
                return f"it sent nothing for {_STALL_S:.0f} s"
            current = _cpu_ticks(pid)
            if current is None or current != ticks:
                ticks, progressed = current, now
            elif now - progressed >= STARVED_S:
                return (f"it ran no CPU time for {STARVED_S:.0f} s while training waited for it: at idle priority it "
                        "gets none while other processes keep every core busy (MEMPROF_WORKER_PRIORITY=nice:0 gives it "
                        "a share)")
        return None

    def _reap(self) -> None:
        if self._proc is not None and not self._proc.stdout.closed:
            self._proc.process.wait()
            self._proc.stdout.close()

    def _why_stopped(self) -> str:
        if self._error:
            return f"it failed: {self._error}"
        code = self._proc.process.poll() if self._proc is not None else None
        return f"it exited with status {code}" if code is not None else "it stopped answering"

    # ------------------------------------------------------------------ taking over
    def _take_over(self, reason: str | None, record: IterationRecord | None = None) -> list[Outcome]:
        """Stops the worker and re-processes, inline from now on, what it had not written; then ``record``.

        ``reason`` is why the worker stopped (``None``: it did not fail, the journal did).
        """
        if self._proc is not None and self._proc.process.poll() is None:
            self._proc.process.kill()
        self._reap()
        self._journal.close()
        self.stopped = reason
        try:
            state = read_state(self.journal_dir)
        except (OSError, CorruptTraceError) as exc:
            if reason is not None:
                self.stopped = f"{reason}; its saved state is unreadable too ({exc}), so memprof stops recording"
            self._inline = DeadSink()
            return []
        self._inline = InlineSink(IterationProcessor(self._spec, state), TraceWriter(self.run_dir))
        outcomes: list[Outcome] = []
        reader = JournalReader(self.journal_dir, state.last_iteration)
        while True:
            try:
                old = reader.next()
            except CorruptTraceError:
                break
            if old is None:
                break
            for outcome in self._inline.submit(old):  # reports already shown are not shown twice
                outcomes.append(outcome if outcome.iteration > self._reported else
                                Outcome(outcome.iteration, write_error=outcome.write_error,
                                        detailed=outcome.detailed))
        if record is not None:
            outcomes += self._inline.submit(record)
        return outcomes
