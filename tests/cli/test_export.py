"""``memprof export``: JSON and standalone Python, one-line errors with exit code 2, the old output kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from planner.simulation.simulator import simulate
from tests.cli.helpers import TOY, one_line_error
from tests.planner import models as M


def test_every_algorithm_plans_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.solvers.dispatch import ALGORITHMS

    for algorithm in ALGORITHMS:
        out = tmp_path / f"{algorithm}.json"
        assert main(["plan", str(TOY), "--budget", "200MB", "--algorithm", algorithm, "--out", str(out),
                     "--slots", "200"]) == 0, capsys.readouterr().err
        script = tmp_path / f"apply_{algorithm}.py"
        assert main(["export", str(out), "--out", str(script)]) == 0
        assert ('def apply_schedule(model, container="", min_offload_bytes=MIN_OFFLOAD_BYTES, optimizer=None, '
                'strict=True,\n                   compile=None):') in script.read_text()
        assert f"from apply_{algorithm} import apply_schedule" in capsys.readouterr().out


def test_export_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = M.schedule(M.revolve(3), M.chain(3))
    source = tmp_path / "in.json"
    schedule.to_json(source)
    assert main(["export", str(source), "--out", str(tmp_path / "out.json")]) == 0
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["predicted_peak_bytes"] == simulate(schedule.chain, schedule).peak_bytes
    assert main(["export", str(source), "--out", str(tmp_path / "plain.txt"), "--format", "python"]) == 0
    assert "OPS = [['F_ck', 1]," in (tmp_path / "plain.txt").read_text()
    assert "needs only torch" in capsys.readouterr().out


def test_export_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.json"
    M.schedule(M.revolve(3), M.chain(3)).to_json(source)
    early = [M.Op(M.CK, 1), *M.revolve(3)]  # valid, but recomputes stage 1 before the loss
    M.schedule(early, M.chain(3)).to_json(tmp_path / "wasted.json")
    out = tmp_path / "apply.py"
    out.write_text("previous")
    cases = [
        ([str(tmp_path / "missing.json"), "--out", str(out)], "no schedule file"),
        ([str(TOY), "--out", str(out)], "not a memprof schedule"),
        ([str(source), "--out", str(tmp_path / "apply.txt")], "cannot tell the format"),
        ([str(source), "--out", str(out), "--format", "yaml"], "--format must be one of json, python"),
        ([str(tmp_path / "wasted.json"), "--out", str(out)], "the executor cannot run this schedule"),
    ]
    for args, fragment in cases:
        assert main(["export", *args]) == 2
        one_line_error(capsys, "memprof export: error:", fragment)
    assert out.read_text() == "previous"
