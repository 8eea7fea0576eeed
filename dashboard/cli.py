"""The ``memprof`` command: one entry point that composes the profiler, planner and dashboard.

It lives in the dashboard package because it is the application layer: dependencies point
dashboard -> planner -> memprof, never back. Each package contributes its sub-commands through a
``register(subparsers)`` function; every command returns an exit code.

Bad input (a corrupt trace, an unknown algorithm, an infeasible budget ...) is reported as one line
on stderr with exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from memprof.errors import MemprofError
from memprof.units import SizeParseError

EXIT_BAD_INPUT = 2


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
    for register in _registrars():
        register(subparsers)
    return parser


def _registrars() -> list:
    # Imported here so `memprof --help` stays fast and each package owns its commands.
    registrars = []
    for module_name in ("dashboard.report", "planner.cli", "dashboard.commands", "dashboard.demo"):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        registrars.append(module.register)
    return registrars


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``memprof`` command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (MemprofError, SizeParseError) as exc:
        print(f"memprof {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"memprof {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
