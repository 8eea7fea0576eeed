"""The ``memprof`` command: one parser, one sub-command per module of :data:`COMMANDS`, one error contract.

Bad input (a corrupt trace, an unknown algorithm, an infeasible budget, a port in use, a missing extra ...)
is any :class:`~memprof.errors.MemprofError`; it is reported as one line on stderr with exit code 2, never
as a traceback. Usage errors (a missing argument, a malformed option value) are one line with exit code 2
too, from the parser. Ctrl+C exits with 130. Library warnings raised while a command runs (a solver's fallback, a corrected chain)
are one line on stderr too (``memprof plan: warning: ...``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from cli import dashboard, demo, estimate, export, export_snapshot, import_snapshot, plan, profile_ops, report
from memprof.errors import MemprofError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
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
    args = build_parser().parse_args(argv)
    formatted = warnings.formatwarning
    warnings.formatwarning = _one_line_warning(args.command)
    try:
        return int(args.func(args) or 0)
    except MemprofError as exc:
        print(f"memprof {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"memprof {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        warnings.formatwarning = formatted


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
