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

FORMATS = ("json", "python")
EXPORT_MODES = ("auto", "checkpoint", "executor")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``plan`` and ``export`` to the ``memprof`` command."""
    plan = subparsers.add_parser(
        "plan", help="solve a rematerialization schedule for a memory budget",
        description="Solve a schedule for the chain of a profiled run (or a chain JSON file) under a budget "
                    "that counts activations, their gradients and overheads (not weights or optimizer state).",
    )
    plan.add_argument("source", metavar="RUN_DIR_OR_CHAIN_JSON", help="a run directory or a chain JSON file")
    plan.add_argument("--budget", required=True, help="memory budget, e.g. 64MiB, 1.5GB, 4096")
    plan.add_argument("--algorithm", default="rotor", help="solver (default rotor; see planner.ALGORITHMS)")
    plan.add_argument("--container", default=None,
                      help="run directories only: the module whose children form the chain (default: found)")
    plan.add_argument("--slots", default="500", help="memory slots of the dynamic programs (default 500)")
    plan.add_argument("--out", required=True, help="where to write the schedule JSON")
    plan.set_defaults(func=run_plan)

    export = subparsers.add_parser(
        "export", help="write a schedule as JSON or as a standalone Python file that applies it",
        description="Write a schedule (from memprof plan) as JSON, or as a Python file that needs only torch: "
                    "`from apply_schedule import apply_schedule; model = apply_schedule(model)`.",
    )
    export.add_argument("schedule", help="a schedule JSON file written by memprof plan")
    export.add_argument("--out", required=True, help="the file to write (.py or .json)")
    export.add_argument("--format", default=None, help="json or python (default: from the --out extension)")
    export.add_argument("--mode", default="auto",
                        help="python only: checkpoint (nested torch.utils.checkpoint), executor, or auto")
    export.set_defaults(func=run_export)


def run_plan(args: argparse.Namespace) -> int:
    """Solves, checks and writes the schedule, then prints a summary against store-all."""
    from planner.export import export_json
    from planner.simulator import simulate
    from planner.solve import solve, solver
    from planner.solvers.store_all import store_all_ops

    budget_bytes = parse_bytes(args.budget)
    slots = _positive_int(args.slots, "--slots")
    solver(args.algorithm)  # an unknown name fails before the chain is read
    chain = load_chain(args.source, args.container)
    schedule = solve(chain, budget_bytes, algorithm=args.algorithm, slots=slots)
    prediction = simulate(chain, schedule)
    schedule = schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms)
    baseline = simulate(chain, store_all_ops(chain))
    out = write_atomically(args.out, export_json(schedule) + "\n")
    print(summary(schedule, baseline.peak_bytes, baseline.makespan_ms, out))
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Writes the schedule as JSON or Python."""
    from planner.export import export_json, export_python, nested_plan

    fmt = _format(args.format, args.out)
    if args.mode not in EXPORT_MODES:
        raise PlannerError(f"--mode must be one of {', '.join(EXPORT_MODES)}, found {args.mode!r}")
    schedule = Schedule.from_json(Path(args.schedule))
    if fmt == "json":
        out = write_atomically(args.out, export_json(schedule) + "\n")
        print(f"wrote {out}: {schedule.algorithm} schedule, {len(schedule.ops)} operations")
        return 0
    text = export_python(schedule, mode=args.mode)
    out = write_atomically(args.out, text)
    nested = args.mode != "executor" and nested_plan(schedule) is not None
    how = "nested torch.utils.checkpoint" if nested else "the embedded executor"
    print(f"wrote {out}: {schedule.algorithm} schedule run with {how}; in the training script add")
    print(f"    from {out.stem} import apply_schedule")
    print("    model = apply_schedule(model)")
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
        from memprof.reader import load_trace
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


def summary(schedule: Schedule, store_all_peak_bytes: int, store_all_makespan_ms: float, out: Path) -> str:
    """A few lines: algorithm, budget, predicted peak and makespan against store-all, recomputations."""
    peak = int(schedule.predicted_peak_bytes or 0)
    makespan = float(schedule.predicted_makespan_ms or 0.0)
    forwards = sum(op.kind is not OpKind.B for op in schedule.ops)
    recomputations = forwards - (schedule.chain.length + 1)
    budget = "none" if schedule.budget_bytes is None else format_bytes(schedule.budget_bytes)
    return "\n".join([
        f"{schedule.algorithm} schedule for chain {schedule.chain.name!r} ({schedule.chain.length} stages + loss)",
        f"  budget           {budget}",
        f"  predicted peak   {format_bytes(peak)} (store-all {format_bytes(store_all_peak_bytes)}, "
        f"{_change(peak, store_all_peak_bytes)})",
        f"  makespan         {makespan:.3f} ms (store-all {store_all_makespan_ms:.3f} ms, "
        f"{_change(makespan, store_all_makespan_ms)})",
        f"  operations       {len(schedule.ops)} ({recomputations} recomputed forwards)",
        f"wrote {out}",
    ])


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
