"""``memprof plan`` and ``memprof export``: a schedule from a profiled run or a chain file, and its export.

Both commands check everything before writing, and write ``--out`` atomically (a temporary file in the same
directory, then ``os.replace``), so a failed command never leaves a half-written or overwritten file. Bad input
raises a :class:`~memprof.errors.MemprofError` (or :class:`~memprof.units.SizeParseError`), which
``dashboard.cli.main`` prints as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from memprof.units import format_bytes, parse_bytes
from planner.chain import Chain
from planner.errors import ChainError, PlannerError
from planner.schedule import OpKind, Schedule
from planner.step import StepCosts

FORMATS = ("json", "python")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``plan`` and ``export`` to the ``memprof`` command."""
    plan = subparsers.add_parser(
        "plan", help="solve a rematerialization schedule for a memory budget",
        description="Solve a schedule for the chain of a profiled run (or a chain JSON file) under a memory "
                    "budget. For a run (or a chain file with step costs) --budget is the whole training step's "
                    "memory, what the device has: model and optimizer state, batch, activations; "
                    "--activation-budget counts only the chain's activations, their gradients and overheads.",
    )
    plan.add_argument("source", metavar="RUN_DIR_OR_CHAIN_JSON", help="a run directory or a chain JSON file")
    budgets = plan.add_mutually_exclusive_group(required=True)
    budgets.add_argument("--budget", default=None,
                         help="memory of the whole training step (what the device has), e.g. 8GiB, 1.5GB, 4096; "
                              "for a chain file without step costs, the chain's own memory")
    budgets.add_argument("--activation-budget", default=None, metavar="SIZE",
                         help="memory of the chain alone (its activations, their gradients and overheads; the "
                              "ROTOR paper's M), e.g. 512MiB")
    plan.add_argument("--algorithm", default="rotor", help="solver (default rotor; see planner.ALGORITHMS)")
    plan.add_argument("--container", default=None,
                      help="run directories only: the module whose children form the chain (default: found)")
    plan.add_argument("--slots", default="500", help="memory slots of the dynamic programs (default 500)")
    plan.add_argument("--out", required=True, help="where to write the schedule JSON")
    plan.set_defaults(func=run_plan)

    export = subparsers.add_parser(
        "export", help="write a schedule as JSON or as a standalone Python file that applies it",
        description="Write a schedule (from memprof plan) as JSON, or as a Python file that needs only torch: "
                    "`from apply_schedule import apply_schedule; apply_schedule(model)`.",
    )
    export.add_argument("schedule", help="a schedule JSON file written by memprof plan")
    export.add_argument("--out", required=True, help="the file to write (.py or .json)")
    export.add_argument("--format", default=None, help="json or python (default: from the --out extension)")
    export.set_defaults(func=run_export)


def run_plan(args: argparse.Namespace) -> int:
    """Solves, checks and writes the schedule, then prints a summary against store-all."""
    from planner.export import export_json
    from planner.simulator import simulate
    from planner.solve import solve, solver
    from planner.solvers.store_all import store_all_ops

    activations_only = args.activation_budget is not None
    budget_bytes = parse_bytes(args.activation_budget if activations_only else args.budget)
    slots = _positive_int(args.slots, "--slots")
    solver(args.algorithm)  # an unknown name fails before the chain is read
    chain = load_chain(args.source, args.container)
    step = chain.step
    solved = chain.activations_only() if activations_only else chain
    schedule = solve(solved, budget_bytes, algorithm=args.algorithm, slots=slots)
    prediction = simulate(solved, schedule)
    schedule = schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms)
    baseline = simulate(solved, store_all_ops(solved))
    out = write_atomically(args.out, export_json(schedule) + "\n")
    print(summary(schedule, baseline.peak_bytes, baseline.makespan_ms, out, step=step))
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Writes the schedule as JSON or Python."""
    from planner.export import export_json, export_python

    fmt = _format(args.format, args.out)
    schedule = Schedule.from_json(Path(args.schedule))
    if fmt == "json":
        out = write_atomically(args.out, export_json(schedule) + "\n")
        print(f"wrote {out}: {schedule.algorithm} schedule, {len(schedule.ops)} operations")
        return 0
    text = export_python(schedule)
    out = write_atomically(args.out, text)
    print(f"wrote {out}: {schedule.algorithm} schedule (needs only torch); in the training script add")
    print(f"    from {out.stem} import apply_schedule")
    print("    apply_schedule(model)")
    return 0


def load_chain(source: str | Path, container: str | None = None) -> Chain:
    """The chain of a run directory (found, or the children of ``container``) or of a chain JSON file.

    Raises:
        ChainError: no such path, or the file is not a chain.
        NotAChainError, TraceError: the run directory has no usable chain or is not a readable run.
        PlannerError: ``container`` was given with a chain file.
    """
    path = Path(source)
    if path.is_dir():
        from memprof.trace.reader import load_trace
        from planner.from_trace import chain_from_trace

        return chain_from_trace(load_trace(path), container=container)
    if not path.exists():
        raise ChainError(f"no run directory or chain file at {path}")
    if container is not None:
        raise PlannerError(
            f"--container chooses the chain in a run directory, but {path} is a chain file (its stages already "
            "name their modules); drop --container"
        )
    return Chain.from_json(path)


def summary(schedule: Schedule, store_all_peak_bytes: int, store_all_makespan_ms: float, out: Path,
            step: StepCosts | None = None) -> str:
    """A few lines: algorithm, budget, predicted peaks and makespan against store-all, recomputations.

    Args:
        schedule: the schedule, with its prediction.
        store_all_peak_bytes: store-all's simulated peak of the chain (chain-only, the paper's M).
        store_all_makespan_ms: store-all's makespan.
        out: where the schedule was written.
        step: the step costs of the chain it was made for (defaults to the schedule chain's); with them the
            whole step's predicted peak is printed beside the chain's.
    """
    step = step if step is not None else schedule.chain.step
    whole_step = schedule.chain.step is not None  # the budget was the whole step's
    peak = int(schedule.predicted_peak_bytes or 0)
    makespan = float(schedule.predicted_makespan_ms or 0.0)
    forwards = sum(op.kind is not OpKind.B for op in schedule.ops)
    recomputations = forwards - (schedule.chain.length + 1)
    if schedule.budget_bytes is None:
        budget = "none"
    elif whole_step:
        budget = (f"{format_bytes(schedule.budget_bytes)} for the whole step (leaves the chain "
                  f"{format_bytes(max(step.chain_budget_bytes(schedule.budget_bytes), 0))})")
    else:
        budget = f"{format_bytes(schedule.budget_bytes)} for the chain only (activations, their gradients, overheads)"
    lines = [
        f"{schedule.algorithm} schedule for chain {schedule.chain.name!r} ({schedule.chain.length} stages + loss)",
        f"  budget           {budget}",
    ]
    if step is not None:
        step_peak, step_store_all = step.step_peak_bytes(peak), step.step_peak_bytes(store_all_peak_bytes)
        lines += [
            f"  step peak        {format_bytes(step_peak)} predicted for the whole step (store-all "
            f"{format_bytes(step_store_all)}, {_change(step_peak, step_store_all)})",
            f"  beside chain     {format_bytes(step.base_bytes)} ({step.explain_base()}); "
            f"no schedule goes below {format_bytes(step.floor_bytes)}",
        ]
    label = "chain peak      " if step is not None else "predicted peak  "
    lines += [
        f"  {label} {format_bytes(peak)} (store-all {format_bytes(store_all_peak_bytes)}, "
        f"{_change(peak, store_all_peak_bytes)})",
        f"  makespan         {makespan:.3f} ms (store-all {store_all_makespan_ms:.3f} ms, "
        f"{_change(makespan, store_all_makespan_ms)})",
        f"  operations       {len(schedule.ops)} ({recomputations} recomputed forwards)",
        f"wrote {out}",
    ]
    return "\n".join(lines)


def _change(value: float, reference: float) -> str:
    if reference == 0:
        return "n/a"
    return f"{(value - reference) / reference:+.1%}"


def _positive_int(text: str, option: str) -> int:
    try:
        value = int(str(text), 10)
    except ValueError:
        raise PlannerError(f"{option} must be a whole number >= 1, found {text!r}") from None
    if value < 1:
        raise PlannerError(f"{option} must be a whole number >= 1, found {text!r}")
    return value


def _format(fmt: str | None, out: str) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise PlannerError(f"--format must be one of {', '.join(FORMATS)}, found {fmt!r}")
        return fmt
    suffix = Path(out).suffix.lower()
    if suffix == ".py":
        return "python"
    if suffix == ".json":
        return "json"
    raise PlannerError(f"cannot tell the format from {out!r}: name it .py or .json, or pass --format json|python")


def write_atomically(path: str | Path, text: str) -> Path:
    """Writes ``text`` to ``path`` through a temporary file and ``os.replace`` (never a partial file).

    Raises:
        PlannerError: the directory does not exist or cannot be written.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise PlannerError(f"cannot write {path}: directory {directory} does not exist")
    if path.is_dir():
        raise PlannerError(f"cannot write {path}: it is a directory; expected a file name")
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise PlannerError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, _file_mode(path))
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise PlannerError(f"cannot write {path}: {exc.strerror}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _file_mode(path: Path) -> int:
    # mkstemp creates 0600 files; keep an existing file's mode, else what the umask gives a new file.
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
