"""Whether a run's writer is still alive: a run killed mid-training must read as interrupted, not running.

The profiler writes ``status: "running"`` into ``meta.json`` when it opens a run and ``"closed"`` (or
``"failed"``) when it closes it; a process killed with SIGKILL never gets to the second write. So the
opening write also records who the writer is (:func:`writer_record`): its pid, the host and boot it ran
on, and the process's start time. A pid alone is not enough, since pids are reused; pid and start time
together name one process for the life of a boot. The reader then asks :func:`writer_alive`, which
answers from ``/proc`` without touching the writer (no signal, no lock), from any process.

Torch-free and pandas-free: the worker and the reader import it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from memprof.schema import META_FILE, OPS, TABLES, table_dir_name
from memprof.trace.pipeline.journal import JOURNAL_DIR

#: The states a run can be in, as :func:`run_state` names them.
RUNNING, INTERRUPTED, CLOSED, FAILED = "running", "interrupted", "closed", "failed"
_PROC = Path("/proc")


def _boot_id() -> str | None:
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or ``None``."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # a zombie has died; only its exit status is left
        return None
    return int(fields[19])


def writer_record(pid: int | None = None) -> dict[str, Any]:
    """Who is writing a run: stored under ``writer`` in ``meta.json`` when the profiler opens it."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(), "start_ticks": _start_ticks(pid)}


def writer_alive(record: Any) -> bool | None:
    """Whether the process a :func:`writer_record` names still runs; ``None`` when this machine cannot tell.

    It cannot tell for a writer on another host, or without a record (runs written before it existed).
    """
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or isinstance(record["pid"], bool):
        return None
    if record.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if boot is not None and record.get("boot_id") not in (None, boot):
        return False  # the machine restarted since: every process of that boot is gone
    ticks = _start_ticks(record["pid"])
    if ticks is not None:
        return record.get("start_ticks") in (None, ticks)  # another process with a reused pid: the writer died
    if _PROC.joinpath("self").exists():
        return False  # /proc works here and has no such (living) process
    try:  # no /proc (macOS): the pid's existence is all there is to go on
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by another user
    return True


def run_state(meta: dict[str, Any]) -> str:
    """``"closed"``, ``"failed"``, ``"running"`` or ``"interrupted"``: a run still marked running whose writer died.

    Runs without a ``status`` (imported snapshots, estimates, older traces) are finished artifacts: closed.
    """
    status = meta.get("status", CLOSED)
    if status != RUNNING:
        return str(status) if status in (CLOSED, FAILED) else CLOSED
    return INTERRUPTED if writer_alive(meta.get("writer")) is False else RUNNING


def run_stamp(run_dir: Path) -> tuple[int, ...]:
    """Modification times of a run's metadata, table folders and journal; changes whenever a part is written.

    A part is renamed into its table's folder (the folder's time changes); a running run's journal gets
    records before any part (its newest segment's time changes).
    """
    stamps: list[int] = []
    journal = run_dir / JOURNAL_DIR
    segments = sorted(journal.glob("seg-*.log")) if journal.is_dir() else []
    watched = (run_dir / META_FILE, *(run_dir / table_dir_name(t) for t in (*TABLES, OPS)), journal,
               *segments[-1:])
    for path in watched:
        try:
            stat = os.stat(path)
            stamps.extend((stat.st_mtime_ns, stat.st_size if path.is_file() else 0))
        except OSError:
            stamps.extend((0, 0))
    return tuple(stamps)
