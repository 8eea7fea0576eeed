"""The ``memprof`` command: one parser, one sub-command per module of :data:`COMMANDS`, one error contract.

Bad input (a corrupt trace, an unknown algorithm, an infeasible budget, a port in use, a missing extra ...)
is any :class:`~memprof.errors.MemprofError`; it is reported as one line on stderr with exit code 2, never
as a traceback. Usage errors (a missing argument, a malformed option value) are one line with exit code 2
too, from the parser. Ctrl+C exits with 130. Library warnings raised while a command runs (a solver's fallback, a corrected chain)
are one line on stderr too (``memprof plan: warning: ...``), each said once. A command that reads runs
(``set_defaults(reads_runs=True)``: report, plan, export-snapshot) says a damaged run's line once, after its
output (:func:`cli.runs.damage_said_once`); a long-running one (the dashboard) says each as it is found.

Output cut short by its reader (``memprof report RUN | head``) ends the command quietly with exit code 141, as
a tool killed by SIGPIPE exits in a shell (128 + 13): ``set -o pipefail`` scripts see it as they see ``cat``'s.
A negative size (``--budget -5MiB``) reaches the command, which says why it is refused, rather than the parser,
which would take ``-5MiB`` for an option.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from cli import dashboard, demo, estimate, export, export_snapshot, import_snapshot, plan, profile_ops, report
from cli.common import SIZE_OPTIONS
from cli.runs import damage_said_once
from memprof.errors import MemprofError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool whose reader went away
#: Every sub-command, in the order ``memprof --help`` lists them; each module has ``register(subparsers)``.
COMMANDS = (report, plan, export, import_snapshot, export_snapshot, dashboard, demo, estimate, profile_ops)


class _OneLineParser(argparse.ArgumentParser):
    """Reports usage errors as one line (``memprof plan: error: ...``) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every sub-command registered."""
    parser = _OneLineParser(
        prog="memprof",
        description="PyTorch memory profiler, rematerialization planner and dashboard.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    subparsers.required = True
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``memprof`` command line; returns the process exit code.

    Args:
        argv: the arguments after ``memprof`` (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: a usage error (exit code 2) or ``--help`` (0), from the parser.
    """
    args = build_parser().parse_args(_negative_sizes_as_values(sys.argv[1:] if argv is None else argv))
    formatted = warnings.formatwarning
    warnings.formatwarning = _one_line_warning(args.command)
    try:
        with damage_said_once() if getattr(args, "reads_runs", False) else contextlib.nullcontext():
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone now raises here, not at exit
        return code
    except MemprofError as exc:
        print(f"memprof {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"memprof {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        warnings.formatwarning = formatted


def _negative_sizes_as_values(argv: Sequence[str]) -> list[str]:
    """``--budget -5MiB`` as ``--budget=-5MiB``: argparse takes a value starting with ``-`` and a letter for an
    option (``expected one argument``); joined, the value reaches :func:`cli.common.size_option`."""
    joined: list[str] = []
    for token in argv:
        previous = joined[-1] if joined else ""
        if previous in SIZE_OPTIONS and len(token) > 1 and token[0] == "-" and (token[1].isdigit() or token[1] == "."):
            joined[-1] = f"{previous}={token}"
        else:
            joined.append(token)
    return joined


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that the interpreter's last flush at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a file (a test's capture): nothing is flushed at exit
        pass


def _one_line_warning(command: str) -> Any:
    """A ``warnings.formatwarning`` giving ``memprof COMMAND: warning: ...`` on one line, without source lines.

    A message already shown is not shown again (a command may meet the same fallback from two calls).
    Replacing the formatter, not ``showwarning``, leaves warnings to whoever records them (tests, a caller's
    ``catch_warnings``).
    """
    seen: set[str] = set()

    def format_one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                        line: str | None = None) -> str:
        text = " ".join(str(message).split())
        if text in seen:
            return ""
        seen.add(text)
        return f"memprof {command}: warning: {text}\n"

    return format_one_line
