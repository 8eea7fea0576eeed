"""The ``memprof`` command: every command registered, the error contract, a core install without the dashboard."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cli.report
from cli.main import COMMANDS, EXIT_BAD_INPUT, EXIT_INTERRUPTED, build_parser, main
from memprof.errors import MemprofError
from tests.cli.helpers import EXAMPLE_RUN, ROOT, TOY, one_line_error


def test_every_command_is_registered():
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subparsers.choices) == ["report", "plan", "export", "import-snapshot", "export-snapshot", "dashboard",
                                       "demo", "estimate", "profile-ops"]
    assert all(callable(command.register) for command in COMMANDS)


def test_a_memprof_error_is_one_line_and_exit_2(monkeypatch, capsys):
    def fails(args: argparse.Namespace) -> int:
        raise MemprofError("the input is wrong\n  in two lines")

    monkeypatch.setattr(cli.report, "run_report", fails)
    assert main(["report", "run"]) == EXIT_BAD_INPUT == 2
    assert one_line_error(capsys) == "memprof report: error: the input is wrong in two lines"


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.report, "run_report", interrupted)
    assert main(["report", "run"]) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == "memprof report: interrupted"


def test_other_exceptions_are_not_swallowed(monkeypatch):
    def bug(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(cli.report, "run_report", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["report", "run"])


def test_console_exit_codes(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    command = [sys.executable, "-m", "cli", "plan", str(TOY), "--out", str(out), "--budget", "64XB"]
    bad = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and not out.exists()
    assert bad.stderr.strip() == "memprof plan: error: unknown unit 'XB' in '64XB'; use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"


def test_plan_report_and_export_never_import_the_dashboard_extra(tmp_path: Path) -> None:
    """A core install (torch, numpy, pandas, pyarrow) runs every command but the dashboard's."""
    script = textwrap.dedent(f"""
        import sys
        from cli.main import main
        assert main(["plan", {str(TOY)!r}, "--budget", "90MiB", "--out", {str(tmp_path / "s.json")!r}]) == 0
        assert main(["export", {str(tmp_path / "s.json")!r}, "--out", {str(tmp_path / "apply.py")!r}]) == 0
        assert main(["report", {str(EXAMPLE_RUN)!r}]) == 0
        print("LOADED", sorted(m for m in ("dash", "plotly", "flask") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
