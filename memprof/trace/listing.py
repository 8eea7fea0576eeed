"""Finding runs and reading their metadata: what ``list_runs`` and every opening of a run start with.

Only ``meta.json`` is read here (no Parquet), so listing a folder of many runs stays cheap; a run still
marked running whose writer died is listed as interrupted (:mod:`memprof.trace.liveness`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprof.errors import CorruptTraceError, SchemaVersionError, TraceError, TraceNotFoundError
from memprof.schema import FORMAT_NAME, META_FILE, META_KEYS, READABLE_VERSIONS, SCHEMA_VERSION
from memprof.trace.liveness import run_state


def read_meta(run_dir: Path) -> dict[str, Any]:
    """Reads and validates ``meta.json`` of a run directory.

    Raises:
        TraceNotFoundError: the directory or its ``meta.json`` is missing.
        CorruptTraceError: the file is not JSON or not a memprof trace.
        SchemaVersionError: the schema version is not one this reader knows.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceNotFoundError(f"no trace directory at {run_dir}: expected a run directory written by memprof")
    path = run_dir / META_FILE
    if not path.is_file():
        hint = ""
        if any(run_dir.glob("rank=*")):
            hint = f"; it holds per-rank traces, open one of {sorted(p.name for p in run_dir.glob('rank=*'))}"
        raise TraceNotFoundError(f"{run_dir} has no {META_FILE}: expected a memprof run directory{hint}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptTraceError(f"{path} is not valid JSON ({exc}); expected memprof trace metadata") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CorruptTraceError(f"{path} is not memprof metadata: expected format {FORMAT_NAME!r}, found {found!r}")
    version = meta.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise SchemaVersionError(
            f"{path} has schema_version {version!r}; this memprof reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
            + (": upgrade memprof to read it" if isinstance(version, int) and version > SCHEMA_VERSION else "")
        )
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CorruptTraceError(f"{path} lacks required keys {missing}")
    return meta


@dataclass(frozen=True)
class RunEntry:
    """A run (or one rank of a distributed run) found under a traces folder.

    Attributes:
        path: the directory that ``load_trace`` opens.
        name: the path relative to the traces folder, e.g. ``"mlp-2026..."`` or ``"ddp/rank=1"``.
        meta: the validated metadata, or ``None`` when the run could not be read.
        error: why the run could not be read, or ``None``.
        state: ``"running"``, ``"interrupted"`` (its writer died without closing it), ``"closed"``,
            ``"failed"``, or ``"unreadable"`` (see :func:`memprof.trace.liveness.run_state`).
    """

    path: Path
    name: str
    meta: dict[str, Any] | None
    error: str | None
    state: str = "closed"


def list_runs(traces_dir: str | Path) -> list[RunEntry]:
    """Finds every run under ``traces_dir`` (one level, plus ``rank=<r>`` subdirectories).

    Unreadable runs are listed with their error instead of raising, so one bad run does not hide
    the others; a run whose writer died is listed as ``"interrupted"``. Only metadata is read.
    """
    root = Path(traces_dir)
    if not root.is_dir():
        raise TraceNotFoundError(f"no traces folder at {root}")
    entries: list[RunEntry] = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        ranks = sorted(p for p in child.glob("rank=*") if p.is_dir())
        entries.extend(run_entry(run_dir, run_dir.relative_to(root).as_posix()) for run_dir in ranks or [child])
    return entries


def run_entry(run_dir: Path, name: str) -> RunEntry:
    """One run as :func:`list_runs` lists it (only ``meta.json`` read): what a live listing reads again per run.

    Args:
        run_dir: the run directory.
        name: its name relative to the traces folder.
    """
    try:
        meta = read_meta(run_dir)
    except TraceError as exc:
        return RunEntry(run_dir, name, None, str(exc), "unreadable")
    return RunEntry(run_dir, name, meta, None, run_state(meta))
