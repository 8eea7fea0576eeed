"""``memprof plan``: outputs, one-line errors with exit code 2, atomic writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from memprof import load_trace
from memprof.units import format_bytes
from planner import chain_from_trace
from planner.model.chain import Chain
from planner.model.schedule import Schedule
from planner.model.step import StepCosts
from planner.simulation.simulator import simulate
from planner.solvers.dispatch import min_feasible_budget
from planner.solvers.store_all import store_all_ops
from tests.cli.helpers import EXAMPLE_RUN, MIB, TOY, one_line_error


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
    found = chain_from_trace(load_trace(EXAMPLE_RUN))
    assert schedule.chain.fingerprint() == found.fingerprint() and schedule.chain.step == found.step
    assert schedule.chain.stages[0].modules and schedule.chain.step is not None
    assert "store_all schedule" in capsys.readouterr().out


def test_plan_budget_of_a_run_is_the_whole_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(EXAMPLE_RUN), "--budget", "10MiB", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    step = schedule.chain.step
    assert schedule.budget_bytes == 10 * MIB
    assert schedule.predicted_step_peak_bytes == step.step_peak_bytes(schedule.predicted_peak_bytes) <= 10 * MIB
    assert schedule.predicted_peak_bytes <= step.chain_budget_bytes(10 * MIB)
    text = capsys.readouterr().out
    assert "budget           10.0 MiB for the whole step (leaves the chain " in text
    assert f"step peak        {format_bytes(schedule.predicted_step_peak_bytes)} predicted for the whole step" in text
    assert f"chain peak       {format_bytes(schedule.predicted_peak_bytes)} (store-all " in text
    assert f"no schedule goes below {format_bytes(step.floor_bytes)}" in text


def test_plan_activation_budget_counts_the_chain_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    step = chain_from_trace(load_trace(EXAMPLE_RUN)).step
    assert main(["plan", str(EXAMPLE_RUN), "--activation-budget", "9MiB", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.chain.step is None and schedule.predicted_step_peak_bytes is None
    assert schedule.budget_bytes == 9 * MIB and schedule.predicted_peak_bytes <= 9 * MIB
    text = capsys.readouterr().out
    assert "budget           9.0 MiB for the chain only" in text
    # the whole step it implies, from the run's step costs, beside the chain's own peak
    assert f"step peak        {format_bytes(step.step_peak_bytes(schedule.predicted_peak_bytes))} predicted" in text
    assert f"chain peak       {format_bytes(schedule.predicted_peak_bytes)}" in text
    # the same number as --budget solves a different (larger) problem: the step holds more than the chain
    whole = tmp_path / "whole.json"
    assert main(["plan", str(EXAMPLE_RUN), "--budget", "9MiB", "--out", str(whole)]) == 0
    assert Schedule.from_json(whole).predicted_peak_bytes <= step.chain_budget_bytes(9 * MIB) < 9 * MIB


def _toy_with_step(tmp_path: Path) -> tuple[Path, StepCosts]:
    step = StepCosts(model_state_bytes=40 * MIB, inputs_bytes=2 * MIB, outside_bytes=8 * MIB,
                     before_peak_bytes=51 * MIB, after_peak_bytes=143 * MIB, optimizer_step_bytes=3 * MIB,
                     optimizer_peak_bytes=143 * MIB)
    path = tmp_path / "toy_step.json"
    Chain.from_json(TOY).with_step(step).to_json(path)
    return path, step


def test_plan_chain_file_with_step_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, step = _toy_with_step(tmp_path)
    out = tmp_path / "schedule.json"
    # 90 MiB for the chain alone is 140 MiB of the step, below the optimizer step's 143 MiB: 150 MiB leaves 100.
    assert main(["plan", str(source), "--budget", "150MiB", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.chain.step == step and schedule.budget_bytes == 150 * MIB
    assert schedule.predicted_step_peak_bytes == step.step_peak_bytes(schedule.predicted_peak_bytes) <= 150 * MIB
    assert "for the whole step (leaves the chain 100.0 MiB)" in capsys.readouterr().out
    assert main(["plan", str(source), "--activation-budget", "90MiB", "--out", str(out)]) == 0
    assert Schedule.from_json(out).budget_bytes == 90 * MIB
    assert "for the chain only" in capsys.readouterr().out


def test_plan_infeasible_step_budget_names_the_minimum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, step = _toy_with_step(tmp_path)
    minimum = min_feasible_budget(Chain.from_json(source))
    out = tmp_path / "schedule.json"
    out.write_text("previous content")
    assert main(["plan", str(source), "--budget", "100MiB", "--out", str(out)]) == 2
    one_line_error(capsys, "memprof plan: error:", "below what the training step needs outside the chain",
                    "the optimizer step needs 3.0 MiB above the model state",
                    f"no schedule can go below {format_bytes(step.floor_bytes)}",
                    f"the smallest budget for rotor is {format_bytes(minimum)}")
    assert out.read_text() == "previous content"
    # a run: the same one-line error, in the run's own numbers
    found = chain_from_trace(load_trace(EXAMPLE_RUN))
    assert main(["plan", str(EXAMPLE_RUN), "--budget", str(found.step.floor_bytes - 1), "--out", str(out)]) == 2
    one_line_error(capsys, found.step.explain_floor(), format_bytes(min_feasible_budget(found)))
    assert out.read_text() == "previous content"


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--budget", "1GiB", "--activation-budget", "1GiB"], "not allowed with argument"),
    ([], "one of the arguments --budget --activation-budget --held-budget is required"),
    (["--held-budget", "1GiB", "--algorithm", "rotor"], "drop --algorithm"),
    (["--held-budget", "1KiB"], "minimum feasible budget for held"),
    (["--activation-budget", "1KiB"], "minimum"),
])
def test_plan_budget_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                             fragment: str) -> None:
    out = tmp_path / "schedule.json"
    try:
        code = main(["plan", str(TOY), "--out", str(out), *extra])
    except SystemExit as exc:  # usage errors exit from the argument parser
        code = exc.code
    assert code == 2
    one_line_error(capsys, "memprof plan: error:", fragment)
    assert not out.exists()


PLAN_ERRORS = [
    (["--budget", "64XB"], "unknown unit 'XB'"),
    (["--budget", "-1"], "--budget: a budget is a positive size such as 5MiB; found -1"),
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
    one_line_error(capsys, "memprof plan: error:", fragment)
    assert out.read_text() == "previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["schedule.json"]


def test_plan_refuses_missing_and_foreign_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(tmp_path / "nope.json"), "--budget", "1GiB", "--out", str(out)]) == 2
    one_line_error(capsys, "no run directory or chain file")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps([1, 2, 3]))
    assert main(["plan", str(foreign), "--budget", "1GiB", "--out", str(out)]) == 2
    one_line_error(capsys, "a chain is a JSON object")
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    assert main(["plan", str(empty_run), "--budget", "1GiB", "--out", str(out)]) == 2
    one_line_error(capsys, "memprof plan: error:")
    assert main(["plan", str(TOY), "--budget", "1GiB", "--out", str(tmp_path / "missing" / "s.json")]) == 2
    one_line_error(capsys, "does not exist")
    assert not out.exists()


def test_plan_binomial_solves_a_long_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.model.chain import Stage
    from planner.solvers.binomial import memory_bounds

    stage = Stage(0.5, 1.0, MIB, MIB, MIB)
    chain = Chain("long", MIB, (stage,) * 2001)  # 2,000 stages plus the loss
    source, out = tmp_path / "long.json", tmp_path / "schedule.json"
    chain.to_json(source)
    budget = int(memory_bounds(chain)[10])
    assert main(["plan", str(source), "--budget", str(budget), "--algorithm", "binomial", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.algorithm == "binomial" and schedule.params.snapshots == 10
    assert simulate(schedule.chain, schedule).peak_bytes <= budget
    text = capsys.readouterr().out
    assert "binomial schedule for chain 'long' (2000 stages + loss)" in text
    recomputed = schedule.params.forwards - 2001
    assert f"operations       {len(schedule.ops)} ({recomputed} recomputed forwards)" in text


def test_rotor_falling_back_to_binomial_warns_in_one_line(tmp_path: Path) -> None:
    # a process of its own: pytest records warnings itself, so only a real run shows what a user reads
    from planner.model.chain import Stage

    chain = Chain("long", MIB, (Stage(0.5, 1.0, MIB, MIB, MIB),) * 41)
    source, out = tmp_path / "long.json", tmp_path / "schedule.json"
    chain.to_json(source)
    code = ("import sys; from planner.solvers import rotor; rotor.MAX_TABLE_BYTES = 1024; "
            "from cli.main import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "plan", str(source), "--budget", "12MiB", "--algorithm",
                           "rotor", "--out", str(out)], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert Schedule.from_json(out).algorithm == "binomial"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memprof plan: warning: rotor on 40 stages"), lines
    assert "solving with binomial checkpointing instead" in lines[0]


def _wide_chain_file(tmp_path: Path) -> Path:
    """Six stages recording four times their output (sizes in MiB), the loss small: offloading pays."""
    stage = {"forward_ms": 2.0, "backward_ms": 4.0, "output_bytes": 10 * MIB, "saved_bytes": 40 * MIB}
    loss = {"forward_ms": 0.1, "backward_ms": 0.1, "output_bytes": 1, "saved_bytes": 1}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"name": "wide", "input_bytes": 10 * MIB, "stages": [stage] * 6 + [loss]}))
    return path


def test_plan_offload_prints_the_host_peak_and_takes_the_link(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    source, out = _wide_chain_file(tmp_path), tmp_path / "schedule.json"
    assert main(["plan", str(source), "--budget", "150MiB", "--algorithm", "offload", "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert schedule.has_transfers and schedule.predicted_host_peak_bytes == simulate(schedule.chain,
                                                                                     schedule).host_peak_bytes > 0
    text = capsys.readouterr().out
    stages = sorted(schedule.params.offloaded)
    assert (f"offloaded        {len(stages)} stages {stages} to host memory: host peak "
            f"{format_bytes(schedule.predicted_host_peak_bytes)} (link 24.0 GB/s out, 24.0 GB/s in, no host cap "
            "(default))") in text
    assert main(["plan", str(source), "--budget", "150MiB", "--algorithm", "offload", "--bandwidth", "2.5",
                 "--host-cap", "60MiB", "--out", str(out)]) == 0
    capped = Schedule.from_json(out)
    assert capped.chain.transfer.host_cap_bytes == 60 * MIB and capped.chain.transfer.d2h_bytes_per_ms == 2.5e6
    assert capped.predicted_host_peak_bytes <= 60 * MIB
    assert "host cap 60.0 MiB (given)" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--bandwidth", "fast"], "--bandwidth must be a number of GB/s > 0, e.g. 24, found 'fast'"),
    (["--bandwidth", "0"], "--bandwidth must be a number of GB/s > 0, e.g. 24, found '0'"),
    (["--host-cap", "12XB"], "12XB"),
])
def test_plan_bad_link_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                            message: str) -> None:
    out = tmp_path / "schedule.json"
    assert main(["plan", str(TOY), "--budget", "90MiB", "--algorithm", "offload", *extra, "--out", str(out)]) == 2
    assert message in one_line_error(capsys)
    assert not out.exists()


def test_plan_of_a_run_with_malformed_phase_times_is_a_one_line_error(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE_RUN, run)
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "phase_times": {"clock": "sundial", "iterations": []}}))
    out = tmp_path / "schedule.json"
    assert main(["plan", str(run), "--budget", "1GiB", "--out", str(out)]) == 2
    one_line_error(capsys, "memprof plan: error:", "phase_times", "remove the key")
    assert not out.exists()


def test_plan_takes_a_torchrun_jobs_folder_for_its_highest_rank_or_the_one_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli.helpers import exit_code
    from tests.memprof.trace.test_folder import _job

    job = _job(tmp_path, (1, 3))
    out = tmp_path / "s.json"
    assert main(["plan", str(job), "--budget", "1GiB", "--out", str(out)]) == 0
    assert "planning for rank 1 of ranks 0, 1 (the highest peak" in capsys.readouterr().out
    assert Schedule.from_json(out).chain.source["run_id"] == "ddp-1"
    assert main(["plan", str(job), "--budget", "1GiB", "--rank", "0", "--out", str(out)]) == 0
    assert "planning for rank 0 of ranks 0, 1 (as asked" in capsys.readouterr().out
    assert Schedule.from_json(out).chain.source["run_id"] == "ddp-0"
    written = out.read_bytes()
    assert exit_code(["plan", str(job), "--budget", "1GiB", "--rank", "5", "--out", str(out)]) != 0
    one_line_error(capsys, "has no rank 5", "rank=0, rank=1")
    assert exit_code(["plan", str(job / "rank=0"), "--budget", "1GiB", "--rank", "0", "--out", str(out)]) != 0
    one_line_error(capsys, "--rank chooses a rank of a torchrun job's folder", "drop --rank")
    assert exit_code(["plan", str(job), "--budget", "1GiB", "--rank", "x", "--out", str(out)]) != 0
    assert "expected a rank" in capsys.readouterr().err
    assert out.read_bytes() == written  # no failed command touched the schedule already written
