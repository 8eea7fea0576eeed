"""What the commands that read a run share: the run checked whole, its damage said once, its state said first.

A damaged page is found only when its part is read (:mod:`memprof.trace.reader`), and ``memprof report``
reads one iteration's layers, ``memprof plan`` a few: a part they never read would go unnoticed. So a
command opens a run with :func:`open_run`, which reads every part once (one part's rows at a time) and lets
the reader skip and record what is damaged. The reader words each damage warning as everything found so far;
:func:`damage_said_once` holds those warnings back while a command runs and says each run's fullest one, so
the command prints one line per damaged run (``memprof report: warning: run r: 1 damaged part skipped: ...``).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.trace import Trace

#: The reader's damage warnings (:func:`memprof.trace.damage.damage_message` after ``run <id>: ``).
_DAMAGE = re.compile(r"^run (?P<run>.+?): (?P<count>\d+) damaged parts? skipped: ")


def open_run(run_dir: str | Path, rank: int | None = None) -> Trace:
    """``load_trace(run_dir, rank=rank)`` with every part read once, so that :attr:`Trace.damage` holds all the
    run's damage (in a torchrun job's folder, ``rank``'s, by default the rank whose peak is highest).

    Raises:
        TraceError: the run cannot be opened (see :func:`memprof.trace.load_trace`).
    """
    from memprof.trace import load_trace

    trace = load_trace(run_dir, rank=rank)
    read_every_part(trace)
    return trace


def read_every_part(trace: Trace) -> None:
    """Reads each part of each table of ``trace`` once, one part's iterations at a time (bounded memory).

    A damaged page is skipped by the reader, which records it in :attr:`Trace.damage` and warns.
    """
    from memprof.schema import OPTIONAL_TABLES, TABLES
    from memprof.trace.parts import list_parts

    for table in (*TABLES, *OPTIONAL_TABLES):
        _, ranges, _ = list_parts(trace.path, table, trace.version)
        if any(r is None for r in ranges):  # a part without statistics: only a whole read reaches it
            trace.read(table)
            continue
        for first, last in sorted({r for r in ranges if r is not None}):
            trace.read(table, iterations=range(first, last + 1))


@contextlib.contextmanager
def damage_said_once() -> Iterator[None]:
    """Within the block, the reader's damage warnings are held back; after it, each run's fullest one is shown.

    Other warnings pass at once. Showing goes through the ``showwarning`` in place before the block, so
    whoever records warnings (a test, a caller's ``catch_warnings``) still gets them.
    """
    shown = warnings.showwarning
    held: dict[str, tuple[int, tuple[Any, ...]]] = {}

    def hold(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        found = _DAMAGE.match(str(message)) if issubclass(category, RuntimeWarning) else None
        if found is None:
            shown(message, category, filename, lineno, file, line)
            return
        # worded as all found so far: the one naming the most parts says everything (the latest on a tie; a
        # command may open the run twice, the second time reading less of it)
        count = int(found["count"])
        if count >= held.get(found["run"], (0, ()))[0]:
            held[found["run"]] = (count, (message, category, filename, lineno, file, line))

    warnings.showwarning = hold
    try:
        yield
    finally:
        if warnings.showwarning is hold:
            warnings.showwarning = shown
        for _, said in held.values():
            shown(*said)


def state_lines(trace: Trace) -> list[str]:
    """What a reader of the run's numbers must know first: it was interrupted, or is still being written, and
    which iterations are complete; nothing for a closed or failed run (a failure has its own post-mortem)."""
    from memprof.trace.damage import format_iterations
    from memprof.trace.liveness import INTERRUPTED, RUNNING, writer_alive

    state = trace.state
    if state not in (INTERRUPTED, RUNNING):
        return []
    numbers = trace.iterations.iteration.tolist()
    complete = (f"iteration{'s' if len(numbers) > 1 else ''} {format_iterations(numbers)} "
                f"{'are' if len(numbers) > 1 else 'is'} complete" if numbers else "no iteration is complete")
    if state == INTERRUPTED:
        return [f"run {trace.run_id} was INTERRUPTED: its process ended without closing it (killed or crashed); "
                f"{complete}, and only those are shown"]
    writer = trace.meta.get("writer") or {}
    if writer_alive(writer):
        return [f"run {trace.run_id} is still RUNNING (process {writer.get('pid')} is writing it); {complete} "
                "so far, and only those are shown"]
    return [f"run {trace.run_id} is marked RUNNING, but whether its process is alive cannot be told from here "
            f"(written on another machine, or by an older memprof); {complete} so far, and only those are shown"]
