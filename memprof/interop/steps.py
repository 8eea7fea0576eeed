"""A device's history cut into iterations, each with the marks, observations and rows memprof's analysis takes.

Phases. Each allocation's phase is what its frames say (:mod:`memprof.interop.frames`). An allocation without
frames is in ``backward`` when a forward allocation came before it since the last optimizer allocation
(autograd's engine thread has no Python frames, so with ``stacks="python"`` its allocations have none),
otherwise in the phase before it. Frees, segment actions and ``oom`` entries are in the phase of the
allocation before them.

Iterations. Snapshots memprof exported name each entry's iteration. Otherwise a new iteration begins where a
forward allocation follows a backward or optimizer one: right after the last backward or optimizer entry
before it (so ``zero_grad``'s frees and the next batch's copy belong to the next iteration, as
``record_stats()`` after ``optimizer.step()`` cuts them). A trace with neither phase is one iteration, 0.

Categories. The marks (:mod:`memprof.interop.marks`) make each run of forward entries the root module's
forward, so the analysis (:func:`memprof.analysis.attribution.sweep`) applies memprof's own rule to forward
allocations (``feature_maps`` when alive at the forward's end, else ``other``). The other categories are
observed here: frames that name one; backward allocations alive when the backward run ends are
``weight_grads``, those freed in it ``grads``; optimizer allocations alive when the step ends are
``optimizer_state``. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memprof.categories import Category
from memprof.interop.frames import Label, Labeler, label, static_category, zero_grad_frames
from memprof.interop.marks import ModuleTable, Step, StepBuilder
from memprof.interop.replay import Block, Entry, Replay
from memprof.phases import Phase

_STEP_PHASES = (Phase.BACKWARD, Phase.OPTIMIZER)


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
        reserved = StepBuilder(step, table).build(labels[start:end], phases[start:end], categories[start:end])
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
        temporary = i in freed_at and freed_at[i] <= run_end[i]  # freed before its phase's run ends
        category = None
        if entry.action != "alloc":
            pass
        elif lab.exact or lab.category is not None:
            category = lab.category
        elif phase == Phase.BACKWARD:
            category = Category.GRADS if temporary else Category.WEIGHT_GRADS
        elif phase == Phase.OPTIMIZER and not temporary:
            category = Category.OPTIMIZER_STATE
        found.append(category)
    return found
