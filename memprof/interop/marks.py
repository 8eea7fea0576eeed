"""The marks, observations and rows of one iteration: what memprof's analysis takes, from a snapshot's entries.

Each run of forward entries is the root module's forward (``Mark.FWD_ENTER``/``FWD_EXIT`` of module 0), inside
which the module calls of the allocations' frames open and close, outermost first; a run of backward entries is
the root's backward (``BWD_ENTER``/``BWD_EXIT`` of module 0, then ``BWD_END``), a run of optimizer entries the
optimizer step. Marks sit between entries (entries are at least 4 ns apart: exits 2 ns before the entry,
enters 1 ns before), so the analysis sees each allocation inside the calls its frames show. Every mark and
every entry but ``free_requested`` and ``snapshot`` is a row of the events table. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from memprof.analysis.records import CAT, Mark, MarkRow, ObservationRow
from memprof.categories import Category
from memprof.interop.frames import Label, ModuleCall
from memprof.interop.replay import Entry
from memprof.phases import Phase

#: Names of the rows of each mark, as :mod:`memprof.analysis.timeline` gives them.
_MARK_ROWS = {Mark.FWD_ENTER: ("forward", "enter"), Mark.FWD_EXIT: ("forward", "exit"),
              Mark.BWD_ENTER: ("backward", "enter"), Mark.BWD_EXIT: ("backward", "exit"),
              Mark.BWD_END: ("backward", "end"), Mark.OPT_ENTER: ("optimizer", "enter"),
              Mark.OPT_EXIT: ("optimizer", "exit")}
_ROW_EVENTS = {"alloc": "alloc", "free_completed": "free", "oom": "oom"}


class Row(NamedTuple):
    """One row of the events table: the series' state it shows and what it says."""

    state: int
    time_ns: int
    phase: str
    module: str
    event: str
    reserved_bytes: int


@dataclass
class ModuleTable:
    """The modules the frames name, root (``""``, the whole snapshot) first; an index is fixed once given."""

    names: list[str] = field(default_factory=lambda: [""])
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    kinds: list[str] = field(default_factory=lambda: ["snapshot"])

    _index: dict[str, int] = field(default_factory=lambda: {"": 0}, repr=False)

    def add(self, name: str, parent: int, kind: str) -> int:
        """The index of module ``name``, added under ``parent`` when new."""
        if name not in self._index:
            self._index[name] = len(self.names)
            self.names.append(name)
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.kinds.append(kind)
        return self._index[name]


@dataclass
class Step:
    """One iteration, ready for the analysis.

    Attributes:
        iteration: its number.
        entries: its trace entries.
        marks, observations: the analysis' inputs (see the module docstring).
        rows: its rows of the events table, in order.
        start_ns, end_ns: its first and last rows' times.
        reserved_start_bytes: reserved bytes when it began.
        oom: the last ``oom`` entry in it and the module running then, if any.
    """

    iteration: int
    entries: list[Entry]
    marks: list[MarkRow] = field(default_factory=list)
    observations: list[ObservationRow] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    reserved_start_bytes: int = 0
    oom: tuple[Entry, str] | None = None


class _Open(NamedTuple):
    component: str
    name: str
    module: int
    counts: dict[str, int]


class StepBuilder:
    """Walks one iteration's entries, putting marks before them and a row after each."""

    def __init__(self, step: Step, table: ModuleTable) -> None:
        self.step, self.table = step, table
        self.phase = Phase.OTHER
        self.stack: list[_Open] = []
        self.root_counts: dict[str, int] = {}
        self.changes = 0
        self.reserved = step.reserved_start_bytes

    def build(self, labels: Sequence[Label], phases: Sequence[Phase], categories: Sequence[Category | None]) -> int:
        """Fills the step; returns the reserved bytes at its end."""
        step = self.step
        first_ns = step.entries[0].time_ns if step.entries else 0
        step.start_ns = first_ns - 3 if step.entries else 0
        step.rows.append(Row(0, step.start_ns, "other", "", "start", self.reserved))
        for entry, lab, phase, category in zip(step.entries, labels, phases, categories):
            if phase != self.phase:
                self._close(entry.time_ns - 2)
                self._open(phase, entry.time_ns - 1)
            if phase == Phase.FORWARD and entry.action == "alloc":
                self._enter_calls(lab.calls, lab.exact, entry.time_ns)
            self._entry(entry, phase)
            if category is not None:
                step.observations.append((entry.time_ns, entry.addr, CAT[category], 0))
        step.end_ns = (step.entries[-1].time_ns + 1) if step.entries else step.start_ns
        self._close(step.end_ns)
        step.rows.append(Row(self.changes, step.end_ns, "other", "", "end", self.reserved))
        return self.reserved

    def _entry(self, entry: Entry, phase: Phase) -> None:
        action = entry.action
        if action in ("alloc", "free_completed"):
            self.changes += 1
        elif action in ("segment_alloc", "segment_map"):
            self.reserved += entry.size
        elif action in ("segment_free", "segment_unmap"):
            self.reserved -= entry.size
        module = self.stack[-1].name if self.stack else ""
        if action == "oom":
            self.step.oom = (entry, module)
        self.step.rows.append(Row(self.changes, entry.time_ns, phase.value, module, _ROW_EVENTS.get(action, action),
                                  self.reserved))

    def _mark(self, time_ns: int, kind: Mark, module: int) -> None:
        self.step.marks.append((time_ns, kind, module, []))
        phase, event = _MARK_ROWS[kind]
        name = self.table.names[module] if module >= 0 else ""
        self.step.rows.append(Row(self.changes, time_ns, phase, name, event, self.reserved))

    def _open(self, phase: Phase, time_ns: int) -> None:
        self.phase = phase
        if phase == Phase.FORWARD:
            self.root_counts = {}
            self._mark(time_ns, Mark.FWD_ENTER, 0)
        elif phase == Phase.BACKWARD:
            self._mark(time_ns, Mark.BWD_ENTER, 0)
        elif phase == Phase.OPTIMIZER:
            self._mark(time_ns, Mark.OPT_ENTER, -1)

    def _close(self, time_ns: int) -> None:
        if self.phase == Phase.FORWARD:
            self._exit_calls(0, time_ns)
            self._mark(time_ns, Mark.FWD_EXIT, 0)
        elif self.phase == Phase.BACKWARD:
            self._mark(time_ns, Mark.BWD_EXIT, 0)
            self._mark(time_ns, Mark.BWD_END, -1)
        elif self.phase == Phase.OPTIMIZER:
            self._mark(time_ns, Mark.OPT_EXIT, -1)
        self.phase = Phase.OTHER

    def _exit_calls(self, depth: int, time_ns: int) -> None:
        while len(self.stack) > depth:
            self._mark(time_ns, Mark.FWD_EXIT, self.stack.pop().module)

    def _enter_calls(self, calls: Sequence[ModuleCall], exact: bool, time_ns: int) -> None:
        depth = 0
        while depth < min(len(calls), len(self.stack)) and self.stack[depth].component == calls[depth].component:
            depth += 1
        self._exit_calls(depth, time_ns - 2)
        for call in calls[depth:]:
            parent = self.stack[-1] if self.stack else None
            counts = parent.counts if parent is not None else self.root_counts
            counts[call.component] = counts.get(call.component, 0) + 1
            suffix = "" if exact or counts[call.component] == 1 else f"#{counts[call.component]}"
            name = (f"{parent.name}." if parent is not None else "") + call.component + suffix
            index = self.table.add(name, parent.module if parent is not None else 0, call.kind)
            self._mark(time_ns - 1, Mark.FWD_ENTER, index)
            self.stack.append(_Open(call.component, name, index, {}))
