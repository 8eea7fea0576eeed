"""``memprof plan`` and ``memprof export``: outputs, one-line errors with exit code 2, atomic writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.cli import main
from planner.schedule import Schedule
from planner.simulator import simulate
from planner.solvers.store_all import store_all_ops
from tests.planner import models as M

TOY = Path(__file__).with_name("toy_chain.json")
EXAMPLE_RUN = Path(__file__).parents[2] / "traces" / "example"


def _one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_plan_writes_a_schedule_and_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    # The ROTOR paper's toy example (Table 2, sizes in MiB): with 90 MB, the optimum takes 47.4 ms.
    assert main(["plan", str(TOY), "--budget", "90MiB", "--algorithm", "rotor", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    prediction = simulate(schedule.chain, schedule)
    assert schedule.algorithm == "rotor" and schedule.budget_bytes == 90 * 2**20
    assert schedule.predicted_peak_bytes == prediction.peak_bytes <= 90 * 2**20
    assert schedule.predicted_makespan_ms == pytest.approx(prediction.makespan_ms)
    assert prediction.makespan_ms == pytest.approx(47.4, abs=0.05)
    baseline = simulate(schedule.chain, store_all_ops(schedule.chain))
    assert baseline.makespan_ms == pytest.approx(37.4, abs=0.05)
    text = capsys.readouterr().out
    assert "rotor schedule for chain 'rotor-toy' (6 stages + loss)" in text
    assert "budget           90.0 MiB" in text
    assert f"store-all {baseline.makespan_ms:.3f} ms" in text
    assert f"wrote {out}" in text
    assert [p.name for p in tmp_path.iterdir()] == ["schedule.json"]  # no temporary file left behind


def test_plan_reads_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(EXAMPLE_RUN), "--budget", "1GiB", "--algorithm", "store_all", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.ops == store_all_ops(schedule.chain)
    assert schedule.chain.stages[0].modules == ("stem",)
    assert "store_all schedule" in capsys.readouterr().out


def test_every_algorithm_plans_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.solve import ALGORITHMS

    for algorithm in ALGORITHMS:
        out = tmp_path / f"{algorithm}.json"
        assert main(["plan", str(TOY), "--budget", "200MB", "--algorithm", algorithm, "--out", str(out),
                     "--slots", "200"]) == 0, capsys.readouterr().err
        script = tmp_path / f"apply_{algorithm}.py"
        assert main(["export", str(out), "--out", str(script)]) == 0
        assert "def apply_schedule(model, container=CONTAINER):" in script.read_text()
        assert f"from apply_{algorithm} import apply_schedule" in capsys.readouterr().out


def test_export_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = M.schedule(M.revolve(3), M.chain(3))
    source = tmp_path / "in.json"
    schedule.to_json(source)
    assert main(["export", str(source), "--out", str(tmp_path / "out.json")]) == 0
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["predicted_peak_bytes"] == simulate(schedule.chain, schedule).peak_bytes
    assert main(["export", str(source), "--out", str(tmp_path / "plain.txt"), "--format", "python"]) == 0
    assert "PLAN = [[[1], 2], [3]]" in (tmp_path / "plain.txt").read_text()
    assert main(["export", str(source), "--out", str(tmp_path / "ex.py"), "--mode", "executor"]) == 0
    assert "OPS = [['F_ck', 1]," in (tmp_path / "ex.py").read_text()
    assert "the embedded executor" in capsys.readouterr().out


PLAN_ERRORS = [
    (["--budget", "64XB"], "unknown unit 'XB'"),
    (["--budget", "-1"], "expected a byte size"),
    (["--budget", "0"], "positive, finite byte size"),
    (["--budget", "1KiB"], "minimum"),
    (["--budget", "1GiB", "--algorithm", "magic"], "unknown algorithm 'magic'"),
    (["--budget", "1GiB", "--slots", "0"], "--slots must be a whole number >= 1"),
    (["--budget", "1GiB", "--slots", "many"], "--slots must be a whole number >= 1"),
    (["--budget", "1GiB", "--container", "features"], "drop --container"),
]


@pytest.mark.parametrize(("extra", "fragment"), PLAN_ERRORS)
def test_plan_bad_input_is_one_line_and_keeps_the_old_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    out = tmp_path / "schedule.json"
    out.write_text("previous content")
    assert main(["plan", str(TOY), "--out", str(out), *extra]) == 2
    _one_line_error(capsys, "memprof plan: error:", fragment)
    assert out.read_text() == "previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["schedule.json"]


def test_plan_refuses_missing_and_foreign_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(tmp_path / "nope.json"), "--budget", "1GiB", "--out", str(out)]) == 2
    _one_line_error(capsys, "no run directory or chain file")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps([1, 2, 3]))
    assert main(["plan", str(foreign), "--budget", "1GiB", "--out", str(out)]) == 2
    _one_line_error(capsys, "a chain is a JSON object")
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    assert main(["plan", str(empty_run), "--budget", "1GiB", "--out", str(out)]) == 2
    _one_line_error(capsys, "memprof plan: error:")
    assert main(["plan", str(TOY), "--budget", "1GiB", "--out", str(tmp_path / "missing" / "s.json")]) == 2
    _one_line_error(capsys, "does not exist")
    assert not out.exists()


def test_export_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.json"
    wasted = M.with_wasted_recomputations(M.revolve(3), __import__("random").Random(0), 3)
    M.schedule(wasted, M.chain(3)).to_json(source)
    out = tmp_path / "apply.py"
    out.write_text("previous")
    cases = [
        ([str(tmp_path / "missing.json"), "--out", str(out)], "no schedule file"),
        ([str(TOY), "--out", str(out)], "not a memprof schedule"),
        ([str(source), "--out", str(tmp_path / "apply.txt")], "cannot tell the format"),
        ([str(source), "--out", str(out), "--format", "yaml"], "--format must be one of json, python"),
        ([str(source), "--out", str(out), "--mode", "fast"], "--mode must be one of"),
        ([str(source), "--out", str(out), "--mode", "checkpoint"], "not persistent"),
    ]
    for args, fragment in cases:
        assert main(["export", *args]) == 2
        _one_line_error(capsys, "memprof export: error:", fragment)
    assert out.read_text() == "previous"


def test_console_exit_codes(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    command = [sys.executable, "-m", "dashboard.cli", "plan", str(TOY), "--out", str(out), "--budget", "64XB"]
    bad = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and not out.exists()
    assert bad.stderr.strip() == "memprof plan: error: unknown unit 'XB' in '64XB'; use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
