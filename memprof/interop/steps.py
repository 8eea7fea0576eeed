"""A device's history cut into iterations, each with the marks, observations and rows memprof's analysis takes.

Phases. Each allocation's phase is what its frames say (:mod:`memprof.interop.frames`). An allocation without
frames is in ``backward`` when a forward allocation came before it since the last optimizer allocation
(autograd's engine thread has no Python frames, so with ``stacks="python"`` its allocations have none),
otherwise in the phase before it. Frees,
segment actions and ``oom`` entries are in the phase of the allocation before them.

Iterations. Snapshots memprof exported name each entry's iteration. Otherwise a new iteration begins where a
forward allocation follows a backward or optimizer one: right after the last backward or optimizer entry
before it (so ``zero_grad``'s frees and the next batch's copy belong to the next iteration, as
``record_stats()`` after ``optimizer.step()`` cuts them). A trace with neither phase is one iteration, 0.

Marks. Each run of forward entries is the root module's forward (``Mark.FWD_ENTER``/``FWD_EXIT`` of module
0), inside which the module calls of the allocations' frames open and close; a run of backward entries is
the root's backward, a run of optimizer entries the optimizer step. The analysis
(:func:`memprof.analysis.attribution.sweep`) then applies memprof's own rule to forward allocations
(``feature_maps`` when alive at the forward's end, else ``other``). The other categories are observed here:
frames that name one; backward allocations alive when the backward run ends are ``weight_grads``, those freed
in it ``grads``; optimizer allocations alive when the step ends are ``optimizer_state``. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from memprof.analysis.records import CAT, Mark, MarkRow, ObservationRow
from memprof.categories import Category
from memprof.interop.frames import Label, Labeler, ModuleCall, label, static_category, zero_grad_frames
from memprof.interop.replay import Block, Entry, Replay
from memprof.phases import Phase

_STEP_PHASES = (Phase.BACKWARD, Phase.OPTIMIZER)
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


def phases_of(entries: Sequence[Entry], labels: Sequence[Label]) -> list[Phase]:
    """Each entry's phase (module docstring)."""
    current, forward_seen, found = Phase.OTHER, False, []
    for entry, lab in zip(entries, labels):
        if entry.action == "alloc":
            if lab.phase is not None:
                current = lab.phase
            elif forward_seen:
                current = Phase.BACKWARD
            forward_seen = (forward_seen or current == Phase.FORWARD) and current != Phase.OPTIMIZER
        found.append(current)
    return found


def iterations_of(labels: Sequence[Label], phases: Sequence[Phase]) -> list[int]:
    """Each entry's iteration (module docstring)."""
    if any(lab.exact for lab in labels):
        numbers, current = [], 0
        for lab in labels:
            if lab.exact and lab.iteration is not None:
                current = lab.iteration
            numbers.append(current)
        return numbers
    starts, last_step = [], None
    for i, phase in enumerate(phases):
        if phase in _STEP_PHASES:
            last_step = i
        elif phase == Phase.FORWARD and last_step is not None:
            starts.append(last_step + 1)
            last_step = None
    numbers, iteration = [], 0
    for i in range(len(phases)):
        while iteration < len(starts) and starts[iteration] <= i:
            iteration += 1
        numbers.append(iteration)
    return numbers


@dataclass(frozen=True)
class Plan:
    """A device's history ready for the analysis.

    Attributes:
        steps: its iterations.
        modules: the modules their frames name.
        initial_categories: the category of each block live when the trace began (``Replay.initial``'s order).
    """

    steps: list[Step]
    modules: ModuleTable
    initial_categories: list[Category]


def initial_category(block: Block, phases: Sequence[Phase]) -> Category:
    """The category of a block alive when the trace began.

    A block still live at the end has its allocation's frames: :func:`memprof.interop.frames.static_category`.
    A block the trace frees has only its free entry's frames (where it was freed, with PyTorch's default
    ``context="all"``): a ``zero_grad`` frame -> ``weight_grads``; freed in the phase its frames name (or, without
    frames, in backward) -> what that phase frees: ``feature_maps`` in backward (mostly the activations autograd
    saved), ``other`` in forward and the optimizer step (temporaries); otherwise what the frames say.
    """
    if block.freed_at < 0:
        return static_category(block.frames)
    if zero_grad_frames(block.frames):
        return Category.WEIGHT_GRADS
    freed_in = phases[block.freed_at]
    made_in = label(block.frames).phase or freed_in
    if made_in == freed_in and made_in != Phase.OTHER:
        return Category.FEATURE_MAPS if made_in == Phase.BACKWARD else Category.OTHER
    return static_category(block.frames)


def plan_steps(history: Replay) -> Plan:
    """Cuts ``history`` into iterations with their marks, observations and rows."""
    entries = history.entries
    labeler = Labeler()
    labels = [labeler(e.frames) for e in entries]
    phases = phases_of(entries, labels)
    numbers = iterations_of(labels, phases)
    categories = _categories(entries, labels, phases)
    table = ModuleTable()
    steps: list[Step] = []
    reserved = history.initial_reserved_bytes
    start = 0
    while start < len(entries) or not steps:
        end = start
        while end < len(entries) and numbers[end] == numbers[start]:
            end += 1
        number = numbers[start] if entries else 0
        if steps and number <= steps[-1].iteration:  # iteration frames out of order: number on
            number = steps[-1].iteration + 1
        step = Step(number, entries[start:end], reserved_start_bytes=reserved)
        reserved = _StepBuilder(step, table).build(labels[start:end], phases[start:end], categories[start:end])
        steps.append(step)
        start = end
    return Plan(steps, table, [initial_category(b, phases) for b in history.initial])


def _categories(entries: Sequence[Entry], labels: Sequence[Label], phases: Sequence[Phase]) -> list[Category | None]:
    """The category observed for each allocation (``None``: left to the analysis, or not an allocation)."""
    freed_at: dict[int, int] = {}
    open_allocs: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if entry.action == "alloc":
            open_allocs[entry.addr] = i
        elif entry.action == "free_completed" and entry.addr in open_allocs:
            freed_at[open_allocs.pop(entry.addr)] = i
    run_end = list(range(len(entries)))
    for i in range(len(entries) - 2, -1, -1):
        if phases[i] == phases[i + 1]:
            run_end[i] = run_end[i + 1]
    found: list[Category | None] = []
    for i, (entry, lab, phase) in enumerate(zip(entries, labels, phases)):
        category = None
        if entry.action != "alloc" or lab.exact or lab.category is not None:
            category = lab.category if entry.action == "alloc" else None
        elif phase == Phase.BACKWARD:
            freed_in_run = i in freed_at and freed_at[i] <= run_end[i]
            category = Category.GRADS if freed_in_run else Category.WEIGHT_GRADS
        elif phase == Phase.OPTIMIZER and not (i in freed_at and freed_at[i] <= run_end[i]):
            category = Category.OPTIMIZER_STATE
        found.append(category)
    return found


class _StepBuilder:
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
