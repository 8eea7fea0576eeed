"""The ``memprof`` command: every command registered, the error contract, a core install without the dashboard."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cli.report
from cli.main import COMMANDS, EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, build_parser, main
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


def test_a_reader_that_went_away_ends_the_command_quietly(monkeypatch, capsys):
    def cut_short(args: argparse.Namespace) -> int:
        print("a first line")
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli.report, "run_report", cut_short)
    assert main(["report", "run"]) == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


def test_memprof_report_into_a_closed_pipe_exits_141_without_a_traceback() -> None:
    """``memprof report RUN | head``: the reader is gone before the report is written."""
    proc = subprocess.Popen([sys.executable, "-m", "cli", "report", str(EXAMPLE_RUN)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # as head does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


SIZE_OPTIONS = [
    (["plan", str(TOY), "--out", "unused.json"], "--budget", "a budget is a positive size such as 5MiB"),
    (["plan", str(TOY), "--out", "unused.json"], "--activation-budget", "a budget is a positive size such as 5MiB"),
    (["plan", str(TOY), "--out", "unused.json"], "--held-budget", "a budget is a positive size such as 5MiB"),
    (["plan", str(TOY), "--out", "unused.json", "--budget", "1GiB"], "--host-cap",
     "a host cap is a positive size such as 64GiB"),
    (["estimate", "tests.cli.estimate_factories:tiny_gpt", "--max-batch"], "--memory",
     "the memory to fit is a positive size such as 16GiB"),
]


@pytest.mark.parametrize(("argv", "option", "said"), SIZE_OPTIONS, ids=[o for _, o, _ in SIZE_OPTIONS])
@pytest.mark.parametrize("form", ["separate", "joined"])
def test_a_negative_size_is_refused_in_one_line_naming_the_option(capsys, argv, option, said, form):
    value = ["-5MiB"] if option != "--memory" else ["-1.5GiB"]
    given = [option, *value] if form == "separate" else [f"{option}={value[0]}"]
    assert main([*argv, *given]) == 2
    one_line_error(capsys, f"memprof {argv[0]}: error: {option}: {said}; found {value[0]}")


def test_a_value_that_is_no_size_keeps_the_parsers_messages(capsys):
    assert main(["plan", str(TOY), "--out", "unused.json", "--budget=-many"]) == 2
    one_line_error(capsys, "expected a byte size such as '64MiB' or '2GB', found '-many'")


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
