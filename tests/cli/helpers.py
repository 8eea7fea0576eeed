"""Shared by the command-line tests: example inputs and the one-line error check."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).parents[2]
#: The ROTOR paper's toy chain (Table 2, sizes in MiB).
TOY = ROOT / "tests" / "planner" / "toy_chain.json"
#: A profiled run committed with the repository.
EXAMPLE_RUN = ROOT / "traces" / "example"
MIB = 2**20


def one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """The one line on stderr, checked to hold every fragment."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def exit_code(argv: list[str]) -> int:
    """``memprof ARGV`` in this process; usage errors exit from the argument parser, which counts too."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


@contextlib.contextmanager
def printed_warnings() -> Iterator[None]:
    """Within the block warnings are printed on stderr, as outside pytest (which records them instead), each time."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield
