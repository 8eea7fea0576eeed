"""Export a schedule: as JSON, or as a standalone Python file that applies it to a model with only ``torch``.

The Python file embeds the pure-torch runtime (:mod:`planner.executor_stage`, :mod:`planner.executor_runtime`,
:mod:`planner.executor_container`, which import nothing but ``torch`` and the standard library) verbatim, and
the schedule's data. A user adds two lines to a training script::

    from apply_schedule import apply_schedule
    model = apply_schedule(model)

Persistent schedules (``rotor``, ``periodic``, ``sqrt``, ``revolve``, ``store_all``) are written as nested
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` segments (a ``PLAN`` such as
``[[1, [2, 3]], 4]``); any other valid schedule is run by the embedded executor from its ``OPS``.
"""

from __future__ import annotations

import ast
import inspect
import pprint
import textwrap
from collections.abc import Sequence
from typing import Any

from memprof.units import format_bytes
from planner import executor_container, executor_runtime, executor_stage
from planner.errors import InvalidScheduleError
from planner.executor import schedule_layout, validate_ops
from planner.schedule import OpKind, Schedule

MODES = ("auto", "checkpoint", "executor")


class _NotNested(Exception):
    pass


def nested_plan(schedule: Schedule) -> list | None:
    """The schedule as nested checkpoint segments, or ``None`` when it is not persistent.

    Integers are stages run (and recorded) normally; a nested list is one checkpointed segment whose own
    structure says how it is recomputed. Grammar (ROTOR section 4.4), for stages s..t:
    ``F_all(s) B(s)`` when s = t; ``F_all(s) [s+1..t] B(s)``; or ``F_ck(s) F_none(s+1..k-1) [k..t] [s..k-1]``.
    """
    ops = [(op.kind, op.stage) for op in schedule.ops]
    try:
        plan, end = _parse(ops, 0, 1, schedule.chain.length + 1, schedule.chain.length)
    except _NotNested:
        return None
    return plan if end == len(ops) else None


def _parse(ops: list[tuple[OpKind, int]], i: int, first: int, last: int, length: int) -> tuple[list, int]:
    def expect(position: int, kind: OpKind, stage: int) -> None:
        if position >= len(ops) or ops[position] != (kind, stage):
            raise _NotNested

    if i >= len(ops):
        raise _NotNested
    kind, stage = ops[i]
    if stage != first:
        raise _NotNested
    if first == last:
        expect(i, OpKind.F_ALL, first)
        expect(i + 1, OpKind.B, first)
        return ([first] if first <= length else []), i + 2
    if kind is OpKind.F_ALL:
        rest, j = _parse(ops, i + 1, first + 1, last, length)
        expect(j, OpKind.B, first)
        return [first, *rest], j + 1
    if kind is not OpKind.F_CK:
        raise _NotNested
    k = first + 1
    while i + k - first < len(ops) and ops[i + k - first] == (OpKind.F_NONE, k) and k < last:
        k += 1
    right, j = _parse(ops, i + k - first, k, last, length)
    left, j = _parse(ops, j, first, k - 1, length)
    return [left, *right], j


def export_python(schedule: Schedule, mode: str = "auto") -> str:
    """A standalone Python file (imports only ``torch`` and the standard library) applying ``schedule``.

    Args:
        schedule: a valid schedule whose stages name the container's children (or name none: positional).
        mode: ``"checkpoint"`` (nested ``torch.utils.checkpoint``; persistent schedules only),
            ``"executor"`` (the embedded executor; any valid schedule) or ``"auto"`` (the first that applies).

    Raises:
        InvalidScheduleError: the schedule is not valid, or ``"checkpoint"`` was asked for a schedule that is
            not persistent.
        ValueError: an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, found {mode!r}")
    validate_ops(schedule.ops, schedule.chain.length)
    plan = nested_plan(schedule) if mode != "executor" else None
    if mode == "checkpoint" and plan is None:
        raise InvalidScheduleError(
            f"the {schedule.algorithm!r} schedule is not persistent, so nested torch.utils.checkpoint cannot "
            "express it; export it with mode='executor'"
        )
    container, groups = schedule_layout(schedule)
    ops = None if plan is not None else [[op.kind.value, op.stage] for op in schedule.ops]
    return "\n".join([
        _header(schedule, plan is not None),
        _runtime_body(),
        _data(schedule, container or "", groups, plan, ops),
        _APPLY,
    ])


def export_json(schedule: Schedule) -> str:
    """The schedule as JSON (``Schedule.to_json``) with the simulator's prediction.

    The schedule is always simulated, so a file that breaks a dependency is refused
    (:class:`InvalidScheduleError`) even when it carries a stale prediction.
    """
    from planner.simulator import simulate

    prediction = simulate(schedule.chain, schedule)
    return schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms).to_json()


def _header(schedule: Schedule, nested: bool) -> str:
    def size(value: int | None) -> str:
        return "unknown" if value is None else f"{format_bytes(value)} ({value} bytes)"

    how = "nested torch.utils.checkpoint segments" if nested else "the executor embedded below"
    makespan = "unknown" if schedule.predicted_makespan_ms is None else f"{schedule.predicted_makespan_ms:.3f} ms"
    lines = [
        '"""Applies a memprof rematerialization schedule to a model. Needs nothing but torch.',
        "",
        "Usage, in a training script (the container is replaced in place; parameters are unchanged):",
        "",
        "    from apply_schedule import apply_schedule",
        "    model = apply_schedule(model)",
        "",
        f"Schedule: algorithm {schedule.algorithm!r}, {schedule.chain.length} stages, {len(schedule.ops)} operations,",
        f"run with {how}.",
        f"Budget: {size(schedule.budget_bytes)}; predicted peak: {size(schedule.predicted_peak_bytes)};",
        f"predicted makespan: {makespan}. Generated by memprof (planner.export).",
        '"""',
    ]
    return "\n".join(lines)


def _runtime_body() -> str:
    """The runtime modules' code, in dependency order, without docstrings and imports of each other."""
    parts = ["from __future__ import annotations"]
    for module in (executor_stage, executor_runtime, executor_container):
        source = inspect.getsource(module)
        lines = source.splitlines()
        drop: set[int] = set()
        for node in ast.parse(source).body:
            is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
            is_sibling = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner")
            if is_docstring or is_future or is_sibling:
                drop.update(range(node.lineno - 1, node.end_lineno))
        kept = "\n".join(line for i, line in enumerate(lines) if i not in drop).strip("\n")
        title = f"# ---- {module.__name__.rpartition('.')[2]} "
        parts.append(title + "-" * (100 - len(title)) + "\n" + kept)
    return "\n\n\n".join(parts) + "\n"


def _literal(name: str, value: Any) -> str:
    text = pprint.pformat(value, width=110 - len(name) - 3, compact=True, sort_dicts=False)
    return f"{name} = " + textwrap.indent(text, " " * (len(name) + 3)).lstrip()


def _data(schedule: Schedule, container: str, groups: Sequence[Sequence[str]] | None,
          plan: list | None, ops: list | None) -> str:
    info = {
        "algorithm": schedule.algorithm,
        "budget_bytes": schedule.budget_bytes,
        "predicted_peak_bytes": schedule.predicted_peak_bytes,
        "predicted_makespan_ms": schedule.predicted_makespan_ms,
        "stages": schedule.chain.length,
    }
    parts = [
        "",
        "# ---- the schedule " + "-" * 81,
        _literal("SCHEDULE", info),
        "# The container the schedule was made for (qualified name; \"\" is the model itself).",
        _literal("CONTAINER", container),
        "# The container's children that each stage 1..L runs (None: stage l is the l-th child).",
        _literal("STAGES", groups),
        "# Nested checkpoint segments (persistent schedules), or None.",
        _literal("PLAN", plan),
        "# Operations (kind, stage) run by the embedded executor, or None when PLAN is used.",
        _literal("OPS", ops),
    ]
    return "\n".join(parts) + "\n"


_APPLY = '''
def apply_schedule(model, container=CONTAINER):
    """Makes ``container`` (an nn.Sequential that the model calls as one module) follow the schedule.

    A plain nn.Sequential is converted in place (same object; the optimizer's parameters stay valid).

    Returns:
        ``model``; a new module only when the model itself is a subclass of nn.Sequential.
    """
    target = model.get_submodule(container) if container else model
    if not isinstance(target, nn.Sequential):
        raise TypeError(f"{container or 'the model'} is a {type(target).__name__}; expected an nn.Sequential")
    children = children_of(target)
    stages = STAGES if STAGES is not None else [[name] for name in children]
    found = [name for group in stages for name in group]
    if found != list(children):
        raise ValueError(
            f"this schedule runs modules {found} of {container or 'the model'!r}, whose children are "
            f"{list(children)}; expected the same names in the same order"
        )
    ops = None if OPS is None else [tuple(op) for op in OPS]

    def make(old):
        if adoptable(old):
            return ScheduledSequential.adopt(old, stages, ops=ops, plan=PLAN)
        return ScheduledSequential(children, stages, ops=ops, plan=PLAN)

    return install(model, container, make)
'''
