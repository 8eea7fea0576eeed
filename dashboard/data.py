"""Trace access for the dashboard: safe run names, cached reads of only the columns a view needs.

A run is addressed by its name relative to the traces folder (``"mlp"``, ``"ddp/rank=1"``), exactly
as :func:`memprof.list_runs` names it. Names come from the browser, so every name is resolved and
refused when it points outside the folder (``..``, absolute paths, symbolic links leading out).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from dashboard.cache import BoundedCache
from memprof import RunEntry, Trace, list_runs, load_trace
from memprof.categories import CATEGORY_COLUMNS
from memprof.errors import MemprofError, TraceError, TraceNotFoundError
from memprof.trace import (
    EVENTS,
    ITERATIONS,
    LAYERS,
    RankScan,
    rank_dirs,
    rank_of,
    scan_ranks,
)
from memprof.trace.listing import run_entry
from memprof.trace.liveness import INTERRUPTED, RUNNING, run_stamp
from memprof.units import format_bytes

T = TypeVar("T")

#: Columns of the layers table that the Layers view shows.
LAYER_COLUMNS: tuple[str, ...] = (
    "iteration", "module", "parent", "depth", "order", "kind", "weight_bytes", "weight_grad_bytes",
    "buffer_bytes", "feature_map_bytes", "weight_copy_bytes", "comm_buffer_bytes", "output_bytes", "saved_bytes", "forward_ms",
    "backward_ms",
)
#: Columns of the events table that a memory timeline needs.
TIMELINE_COLUMNS: tuple[str, ...] = (
    "iteration", "seq", "time_ns", "phase", "module", "allocated_bytes", "peak_bytes", "reserved_bytes",
    *CATEGORY_COLUMNS,
)
_SUMMARY_COLUMNS = ("iteration", "peak_allocated_bytes", "peak_reserved_bytes")
#: Points the ranks view draws over all ranks (each rank's peaks decimated to its share, keeping every bucket's peak).
RANK_VIEW_POINTS = 32_000
#: Points per rank for a few ranks: more than a plot can show apart.
RANK_VIEW_MAX_POINTS_PER_RANK = 2_000
#: Parts whose footer or frame the store keeps (a footer check is small; a part read is bounded by the bytes).
PART_CACHE_ENTRIES = 4096
#: Exceptions a view turns into a message instead of a server error (bad names, corrupt runs ...).
VIEW_ERRORS = (MemprofError, OSError, KeyError, ValueError)


class UnsafeRunPathError(MemprofError, ValueError):
    """A run name does not name a directory inside the traces folder."""


def resolve_run(traces_dir: str | Path, name: str) -> Path:
    """Turns a run name from the browser into a directory inside ``traces_dir``.

    Raises:
        UnsafeRunPathError: the name is empty, absolute, contains ``..`` or a NUL byte, or resolves
            (following symbolic links) to a place outside the traces folder.
        TraceNotFoundError: the name is safe but no such directory exists.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnsafeRunPathError(f"expected a run name relative to the traces folder, found {name!r}")
    if "\x00" in name or "\\" in name:
        raise UnsafeRunPathError(f"run name {name!r} contains a NUL byte or a backslash; expected a relative path")
    posix = PurePosixPath(name)
    if posix.is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise UnsafeRunPathError(f"run name {name!r} is absolute; expected a name relative to the traces folder")
    if any(part == ".." for part in posix.parts):
        raise UnsafeRunPathError(f"run name {name!r} climbs out with '..'; expected a name inside the traces folder")
    root = Path(traces_dir).resolve()
    target = (root / posix).resolve()
    if target == root or not target.is_relative_to(root):
        raise UnsafeRunPathError(f"run name {name!r} resolves to {target}, outside the traces folder {root}")
    if not target.is_dir():
        raise TraceNotFoundError(f"no run named {name!r} in {root}")
    return target


#: A word that names an exception class (``ArrowInvalid``, ``OSError``): meaningless to a dashboard's user.
_EXCEPTION_NAME = re.compile(r"\b(?:[A-Z][A-Za-z]*(?:Error|Exception|Invalid|Warning)|ArrowInvalid)\b:?\s*")


def plain_message(text: str, traces_dir: Path) -> str:
    """An error's text fit for the page: one line, paths relative to the traces folder, no exception class names."""
    for root in {str(traces_dir.resolve()), str(traces_dir.absolute()), str(traces_dir)}:
        if root not in (".", ""):
            text = text.replace(root.rstrip("/") + "/", "").replace(root, "the traces folder")
    text = _EXCEPTION_NAME.sub("", text)
    return " ".join(text.split())


class TraceStore:
    """Reads runs under one traces folder, caching what it read in a bounded read-only cache.

    Frames returned by this class are shared between requests and browser sessions: callers must not
    modify them (figure builders are pure functions and never do).

    Args:
        traces_dir: the folder holding the runs.
        cache: the cache to use; a new bounded one when ``None``.
    """

    def __init__(self, traces_dir: str | Path, cache: BoundedCache | None = None,
                 part_cache: BoundedCache | None = None) -> None:
        self.traces_dir = Path(traces_dir)
        self.cache = cache if cache is not None else BoundedCache()
        # footers and frames of single parts, keyed on each part's name, time and size: opening a live run
        # again (its stamp changed) reads only the parts written since
        self.part_cache = part_cache if part_cache is not None else BoundedCache(PART_CACHE_ENTRIES, 256 << 20)

    def path(self, name: str) -> Path:
        """The directory of run ``name`` (see :func:`resolve_run`)."""
        return resolve_run(self.traces_dir, name)

    def memo(self, name: str, what: Hashable, build: Callable[[Path], T]) -> T:
        """Returns ``build(run_dir)`` cached under the run's name, its stamp and ``what``."""
        run_dir = self.path(name)
        key = (str(run_dir), run_stamp(run_dir), what)
        return self.cache.get_or_build(key, lambda: build(run_dir))

    def runs(self) -> list[RunEntry]:
        """Every run and rank in the folder (unreadable ones with their error); empty if no folder."""
        try:
            return list_runs(self.traces_dir)
        except TraceNotFoundError:
            return []

    def entry(self, name: str) -> RunEntry:
        """Run ``name`` as :meth:`runs` lists it, its ``meta.json`` read again (its state may have changed since).

        Raises:
            UnsafeRunPathError, TraceNotFoundError: see :func:`resolve_run`.
        """
        return run_entry(self.path(name), name)

    def trace(self, name: str) -> Trace:
        """The opened run (metadata and footers validated; damaged parts skipped, see ``Trace.damage``)."""
        return self.memo(name, "trace", lambda run_dir: load_trace(run_dir, cache=self.part_cache))

    def problem(self, name: str | None) -> str | None:
        """What is wrong with run ``name``, in one line: the same words on every tab; ``None`` when nothing is.

        Unreadable, damaged (parts skipped, iterations lost) and interrupted (its writer died) runs each
        get a sentence; paths are relative to the traces folder and exception class names are left out.
        """
        if not name:
            return None
        try:
            trace = self.trace(name)
            said = [trace.damage_message] if trace.damage else []
            if trace.state == INTERRUPTED:
                said.append(f"its process ended without closing it (killed or crashed); the {len(self.iterations(name))} "
                            "iterations it completed are shown")
        except VIEW_ERRORS as exc:
            return f"Run {name} cannot be opened: {plain_message(str(exc), self.traces_dir)}"
        if not said:
            return None
        return f"Run {name}: " + plain_message("; ".join(s.rstrip(".") for s in said if s), self.traces_dir) + "."

    def is_live(self, name: str | None) -> bool:
        """Whether run ``name`` is still being written by a living process (the page then follows it)."""
        if not name:
            return False
        try:
            return self.trace(name).state == RUNNING
        except VIEW_ERRORS:
            return False

    def stamp(self, name: str) -> tuple[int, ...]:
        """:func:`run_stamp` of run ``name``."""
        return run_stamp(self.path(name))

    def meta(self, name: str) -> dict[str, Any]:
        """The run's ``meta.json``."""
        return self.trace(name).meta

    def iterations(self, name: str) -> pd.DataFrame:
        """The iterations table, sorted by iteration."""
        return self.memo(name, ITERATIONS, lambda _: _sorted(self.trace(name).read(ITERATIONS), ["iteration"]))

    def detail_iterations(self, name: str) -> np.ndarray:
        """The iterations whose detail (layers and events rows) the run holds, ascending.

        Read from the cached iterations table's ``detail`` column (what ``Trace.detail_iterations``
        lists), so no table is read again; every iteration when the column is absent.
        """
        def build(_: Path) -> np.ndarray:
            frame = self.iterations(name)
            numbers = frame["iteration"].to_numpy(dtype=np.int64)
            if "detail" in frame.columns:
                numbers = numbers[frame["detail"].to_numpy(dtype=bool)]
            lost = [i for d in self.trace(name).damage if d.table in (LAYERS, EVENTS) for i in d.iterations]
            return np.setdiff1d(np.unique(numbers), np.asarray(lost, dtype=np.int64))

        return self.memo(name, "detail", build)

    def layers_at(self, name: str, iteration: int) -> pd.DataFrame:
        """The modules of one iteration, in first-forward order; only the parts that may hold it are read."""
        return self.memo(name, (LAYERS, int(iteration)), lambda _: _sorted(self.trace(name).read(
            LAYERS, columns=list(LAYER_COLUMNS), iterations=[int(iteration)]), ["order", "module"]))

    def model_layers(self, name: str) -> pd.DataFrame:
        """The modules of the first detailed iteration (the model's structure); empty when none has detail."""
        detailed = self.detail_iterations(name)
        if not len(detailed):
            return pd.DataFrame({column: [] for column in LAYER_COLUMNS})
        return self.layers_at(name, int(detailed[0]))

    def timeline(self, name: str, iteration: int) -> pd.DataFrame:
        """The events of one iteration with ``time_ms`` since its first event, in event order."""
        return self.memo(name, (EVENTS, int(iteration)), lambda _: self._read_timeline(name, int(iteration)))

    def _read_timeline(self, name: str, iteration: int) -> pd.DataFrame:
        frame = _sorted(self.trace(name).read(EVENTS, columns=list(TIMELINE_COLUMNS), iterations=[iteration]), ["seq"])
        times = frame["time_ns"].to_numpy(dtype=np.int64)
        origin = times[0] if len(times) else 0
        frame = frame.assign(time_ms=(times - origin) / 1e6)
        frame["phase"] = frame["phase"].astype("category")
        return frame

    def rank_peaks(self, name: str) -> RankScan | None:
        """Every rank's summary and decimated peaks when ``name`` is one rank of a distributed run, else ``None``.

        One streaming pass over every rank (:func:`memprof.trace.scan_ranks`), keeping at most
        :data:`RANK_VIEW_POINTS` points over all ranks. Cached on the modification stamps of every rank,
        so a rank still being written is read again.
        """
        run_dir = self.path(name)
        if rank_of(run_dir) is None or int(self.meta(name).get("world_size", 1) or 1) <= 1:
            return None
        root = run_dir.parent
        found = rank_dirs(root)
        stamps = tuple(run_stamp(directory) for _, directory in found)
        points = rank_view_points(len(found))
        return self.cache.get_or_build((str(root), stamps, "rank_peaks", points), lambda: scan_ranks(root, points))

    def summary(self, entry: RunEntry) -> dict[str, Any]:
        """One row of the Runs table: what a user needs to tell runs apart, or why one is unreadable."""
        row: dict[str, Any] = {"name": entry.name, "model": "", "device": "", "created": "", "rank": "",
                               "iterations": None, "peak_bytes": 0, "peak": "", "kind": "", "state": entry.state,
                               "source": "", "run_id": "", "error": plain_message(entry.error or "", self.traces_dir)}
        if entry.meta is None:
            return row
        row["run_id"] = str(entry.meta.get("run_id", ""))
        source = entry.meta.get("source_run")
        row["source"] = str(source) if isinstance(source, str) and isinstance(entry.meta.get("schedule"), dict) else ""
        meta = entry.meta
        row.update(model=str(meta.get("model", "")), device=str(meta.get("device", "")),
                   created=str(meta.get("created_at", ""))[:19].replace("T", " "),
                   rank=f"{meta.get('rank', 0)}/{meta.get('world_size', 1)}",
                   kind=_run_kind(meta))
        try:
            table = self.memo(entry.name, "summary", lambda _: self.trace(entry.name).read(
                ITERATIONS, columns=list(_SUMMARY_COLUMNS)))
        except (TraceError, OSError) as exc:
            row["error"] = plain_message(str(exc), self.traces_dir)
            return row
        peak = int(table["peak_allocated_bytes"].max()) if len(table) else 0
        row.update(iterations=len(table), peak_bytes=peak)
        row["peak"] = format_bytes(peak) if len(table) else "no iterations"
        problem = self.problem(entry.name)
        if problem:  # damaged or interrupted: readable, with a warning (the error column says it in words)
            row["error"] = problem
        return row


def rank_view_points(ranks: int) -> int:
    """Points per rank in the ranks view: :data:`RANK_VIEW_POINTS` shared out, at least 100, at most
    :data:`RANK_VIEW_MAX_POINTS_PER_RANK`."""
    return max(100, min(RANK_VIEW_MAX_POINTS_PER_RANK, RANK_VIEW_POINTS // max(ranks, 1)))


def _run_kind(meta: dict[str, Any]) -> str:
    if meta.get("estimate"):  # memprof.estimate: predicted on fake tensors, not measured
        return f"estimate ({meta.get('modelled_device', '?')}, fake tensors)"
    schedule = meta.get("schedule")
    if isinstance(schedule, dict):
        source = meta.get("source_run", "?")
        return f"measured {schedule.get('algorithm', '?')} schedule of {source}"
    if meta.get("source") == "pytorch-snapshot":
        return f"imported PyTorch snapshot {meta.get('source_file', '')}".rstrip()
    return "profiled"


def _sorted(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return frame.sort_values(by, kind="stable").reset_index(drop=True)
