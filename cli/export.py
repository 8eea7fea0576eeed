"""``memprof export SCHEDULE --out FILE``: a schedule as JSON, or as a Python file that needs only torch.

The schedule is checked before ``--out`` is written, and it is written atomically, so a failed command never
leaves a half-written or overwritten file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import OptionError, write_output
from planner import Schedule

FORMATS = ("json", "python")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof export`` to the ``memprof`` command."""
    export = subparsers.add_parser(
        "export", help="write a schedule as JSON or as a standalone Python file that applies it",
        description="Write a schedule (from memprof plan) as JSON, or as a Python file that needs only torch: "
                    "`from apply_schedule import apply_schedule; apply_schedule(model)`.",
    )
    export.add_argument("schedule", help="a schedule JSON file written by memprof plan")
    export.add_argument("--out", required=True, help="the file to write (.py or .json)")
    export.add_argument("--format", default=None, help="json or python (default: from the --out extension)")
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Writes the schedule as JSON or Python.

    Raises:
        OptionError: a bad ``--format`` or ``--out``.
        MemprofError: the schedule file is missing, foreign or a schedule the executor cannot run.
    """
    from planner import export_json, export_python

    fmt = output_format(args.format, args.out)
    schedule = Schedule.from_json(Path(args.schedule))
    if fmt == "json":
        out = write_output(args.out, export_json(schedule) + "\n")
        print(f"wrote {out}: {schedule.algorithm} schedule, {len(schedule.ops)} operations")
        return 0
    text = export_python(schedule)
    out = write_output(args.out, text)
    print(f"wrote {out}: {schedule.algorithm} schedule (needs only torch); in the training script add")
    print(f"    from {out.stem} import apply_schedule")
    print("    apply_schedule(model)")
    return 0


def output_format(fmt: str | None, out: str) -> str:
    """The format to write: ``fmt`` if given, else the one ``out``'s extension names.

    Raises:
        OptionError: an unknown ``fmt``, or an extension that names neither format.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise OptionError(f"--format must be one of {', '.join(FORMATS)}, found {fmt!r}")
        return fmt
    suffix = Path(out).suffix.lower()
    if suffix == ".py":
        return "python"
    if suffix == ".json":
        return "json"
    raise OptionError(f"cannot tell the format from {out!r}: name it .py or .json, or pass --format json|python")
