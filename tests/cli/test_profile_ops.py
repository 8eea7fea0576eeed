"""``memprof profile-ops``: one recorded training step in a trace with its ops table, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.profile_ops import module_ops
from memprof import load_trace
from tests.cli.helpers import exit_code, one_line_error

FACTORIES = Path(__file__).with_name("ops_factories.py")
F32 = 4


def test_profile_ops_writes_the_ops_of_the_step_after_warmup(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = exit_code(["profile-ops", f"{FACTORIES}:mlp", "--batch-size", "5", "--out", str(tmp_path),
                      "--run-id", "mlp", "--optimizer", "sgd"])
    out = capsys.readouterr().out
    assert code == 0
    trace = load_trace(tmp_path / "mlp")
    assert trace.op_iterations == [1] and len(trace.iterations) == 2
    records = trace.op_records()
    assert [r.op for r in records][:5] == ["aten.t.default", "aten.addmm.default", "aten.relu.default",
                                           "aten.t.default", "aten.addmm.default"]
    rows = {row.module: row for row in module_ops(records)}
    assert rows["1"].saved_bytes == 5 * 16 * F32 and rows["1"].ops == 1  # relu's output, which both save
    assert rows["0"].flops == 2 * 5 * 8 * 16 and rows["0"].saved_bytes == 0
    assert [r.module for r in records] == ["0", "0", "1", "2", "2"]  # the loss, outside the model, is not recorded
    assert f"{len(records)} ops in {len(rows)} modules" in out
    assert "trace " + str(tmp_path / "mlp") in out
    measured = trace.meta["selective_overhead_us_per_op"]
    assert f"a selective checkpoint adds {measured:.1f} us per op here" in out


def test_warmup_zero_records_the_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["profile-ops", f"{FACTORIES}:mlp", "--batch-size", "2", "--out", str(tmp_path),
                      "--run-id", "r", "--warmup", "0", "--optimizer", "none"]) == 0
    trace = load_trace(tmp_path / "r")
    assert trace.op_iterations == [0] and len(trace.iterations) == 1


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--batch-size", "0"], ["--batch-size must be a whole number >= 1"]),
    (["--batch-size", "2", "--warmup", "-1"], ["--warmup"]),
])
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                     fragments: list[str]) -> None:
    assert exit_code(["profile-ops", f"{FACTORIES}:mlp", "--out", str(tmp_path), *argv]) == 2
    one_line_error(capsys, *fragments)


@pytest.mark.parametrize(("factory", "fragments"), [
    ("on_meta", ["meta device", "memprof estimate"]),
    ("step_raises", ["step 0", "raised RuntimeError"]),
    ("never_calls_the_model", ["no op was recorded"]),
    ("missing", ["has no function 'missing'"]),
])
def test_bad_factories_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str,
                                    fragments: list[str]) -> None:
    assert exit_code(["profile-ops", f"{FACTORIES}:{factory}", "--batch-size", "2", "--out", str(tmp_path)]) == 2
    err = one_line_error(capsys, *fragments)
    assert "Traceback" not in err


def test_an_existing_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile-ops", f"{FACTORIES}:mlp", "--batch-size", "2", "--out", str(tmp_path), "--run-id", "same"]
    assert exit_code(argv) == 0
    capsys.readouterr()
    assert exit_code(argv) == 2
    one_line_error(capsys, "already holds a trace")


def test_plan_prices_the_selective_overhead_the_run_measured_or_the_one_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert exit_code(["profile-ops", f"{FACTORIES}:blocks", "--batch-size", "8", "--out", str(tmp_path),
                      "--run-id", "blocks", "--optimizer", "sgd"]) == 0
    run = tmp_path / "blocks"
    assert load_trace(run).meta["selective_overhead_us_per_op"] > 0
    cheapest = {}
    for given in ("measured", "0", "1e6"):
        out = tmp_path / f"plan-{given}.json"
        extra = [] if given == "measured" else ["--selective-overhead-us", given]
        assert exit_code(["plan", str(run), "--budget", "1GiB", "--algorithm", "selective", "--checkpoints",
                          "0,1,2,3", "--out", str(out), *extra]) == 0
        stages = json.loads(out.read_text())["chain"]["stages"]
        cheapest[given] = [min(o["recompute_ms"] for o in s["options"]) for s in stages if s.get("options")]
    assert cheapest["0"] and len(cheapest["0"]) == len(cheapest["measured"]) == len(cheapest["1e6"])
    for free, measured, dear in zip(cheapest["0"], cheapest["measured"], cheapest["1e6"]):
        assert free < measured < dear and dear >= 1000.0  # a second per op, on every op of the block
    capsys.readouterr()
    assert exit_code(["plan", str(run), "--budget", "1GiB", "--selective-overhead-us", "-1"]) == 2
    one_line_error(capsys, "--selective-overhead-us", "microseconds >= 0")


def test_plan_held_budget_picks_options_within_what_the_forward_may_hold(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.model.schedule import Schedule
    from planner.solvers import held

    assert exit_code(["profile-ops", f"{FACTORIES}:blocks", "--batch-size", "8", "--out", str(tmp_path),
                      "--run-id", "blocks", "--optimizer", "sgd"]) == 0
    run, out = tmp_path / "blocks", tmp_path / "held.json"
    plan = ["plan", str(run), "--checkpoints", "0,1,2,3", "--out", str(out)]
    assert exit_code([*plan, "--held-budget", "1GiB"]) == 0
    chain = Schedule.from_json(out).chain
    assert not any(op.option for op in Schedule.from_json(out).ops)  # everything fits: nothing recomputed
    lowest = held.min_held_bytes(chain)
    assert lowest < held.store_all_held_bytes(chain)
    capsys.readouterr()
    assert exit_code([*plan, "--held-budget", str(lowest)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.algorithm == "held" and schedule.params.held_bytes <= lowest
    assert sum(1 for op in schedule.ops if op.option) == sum(1 for s in chain.stages[:-1] if s.options)
    text = capsys.readouterr().out
    assert "held for the backward (the stages' saved activations; the peak is predicted" in text
    assert "stages keep less than everything" in text
    assert exit_code([*plan, "--held-budget", str(lowest - 1)]) == 2
    one_line_error(capsys, "minimum feasible budget for held", str(lowest))
