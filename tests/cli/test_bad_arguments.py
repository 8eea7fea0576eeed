"""Bad ``memprof`` arguments: one line on stderr, exit code 2, nothing on disk changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bad_input import CASES, chain_dict, cli_fails, write_json

# ------------------------------------------------------------------------------------ CLI arguments

def test_unknown_algorithm_container_and_slots(tmp_path, run_dir):
    chain = write_json(tmp_path / "chain.json", chain_dict())
    out = str(tmp_path / "s.json")
    base = ["plan", str(chain), "--budget", "64MiB", "--out", out]
    cli_fails("cli option", [*base, "--algorithm", "magic"], tmp_path)
    cli_fails("cli option", [*base, "--slots", "0"], tmp_path)
    cli_fails("cli option", [*base, "--slots", "many"], tmp_path)
    cli_fails("cli option", [*base, "--container", "features"], tmp_path)
    cli_fails("cli option", ["plan", str(run_dir), "--budget", "64MiB", "--out", out, "--container", "nope"],
              tmp_path, run_dir)
    cli_fails("cli option", ["plan", str(run_dir), "--budget", "64MiB", "--out", str(tmp_path / "no" / "s.json")],
              tmp_path, run_dir)
    cli_fails("cli option", ["report", str(run_dir), "--iteration", "99"], run_dir)


def test_failed_plan_keeps_an_existing_output(tmp_path):
    chain = write_json(tmp_path / "chain.json", chain_dict())
    out = tmp_path / "s.json"
    out.write_text("a schedule the user keeps")
    cli_fails("cli option", ["plan", str(chain), "--budget", "1B", "--out", str(out)], tmp_path)
    assert out.read_text() == "a schedule the user keeps"


def test_the_console_command_prints_one_line(tmp_path):
    """The installed ``memprof`` command, in its own process, behaves like ``main``."""
    command = Path(sys.executable).with_name("memprof")
    if not command.exists():
        pytest.skip("the memprof console command is not installed in this environment")
    chain = write_json(tmp_path / "chain.json", chain_dict())
    for argv in (["report", str(tmp_path / "absent")],
                 ["plan", str(chain), "--budget", "64XB", "--out", str(tmp_path / "s.json")]):
        CASES["console command"] += 1
        done = subprocess.run([str(command), *argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "s.json").exists()


