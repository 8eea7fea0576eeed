"""``memprof report``: a run's summary; for a failed run the post-mortem and the planner's advice."""

from __future__ import annotations

import argparse

import pytest
import torch

from cli.main import main
from cli.report import run_report
from examples import zoo
from memprof import MemoryBudgetExceeded, MemoryProfiler, load_trace
from tests.cli.helpers import EXAMPLE_RUN, exit_code, one_line_error
from tests.dashboard.fixtures import write_profiled_run


def _failed_run(root, budget_bytes: int) -> object:
    """A run whose last iteration (2) failed; iterations 0 and 1 completed."""
    failure = {"iteration": 2, "message": "CUDA out of memory", "module": "features.3", "phase": "backward",
               "last_event": "enter", "allocated_bytes": budget_bytes - 4096, "budget_bytes": budget_bytes,
               "categories": {"weights": 1000, "feature_maps": 2000}}
    write_profiled_run(root / "failed", "failed", iterations=3, failure=failure)
    return load_trace(root / "failed")


def _guarded_run(tmp_path, budget_bytes: int):
    """A run of an MLP that crosses the profiler's budget guard in its first iteration."""
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=4, width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(MemoryBudgetExceeded), \
            MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, budget_bytes=budget_bytes) as prof:
        for _ in range(3):
            zoo.train_step(model, optimizer, make_batch(64))
            prof.record_stats()
    return prof


def test_report_prints_the_advice(tmp_path, capsys: pytest.CaptureFixture[str]):
    trace = _failed_run(tmp_path, 10**9)
    assert run_report(argparse.Namespace(run_dir=str(trace.path), iteration=None, top=3)) == 0
    text = capsys.readouterr().out
    assert "FAILED in iteration 2: CUDA out of memory" in text
    assert "the rotor schedule fits the 953.7 MiB the step had: predicted step peak " in text


def test_report_shows_the_post_mortem(tmp_path, capsys):
    weights = sum(p.numel() * 4 for p in zoo.mlp(blocks=4, width=512)[0].parameters())
    prof = _guarded_run(tmp_path, weights + 512 * 1024)
    assert main(["report", str(prof.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "FAILED" in out and "crossed the budget" in out and "feature maps" in out


def test_report_gives_the_planners_answer_after_complete_iterations(tmp_path, capsys):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=4, width=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = 2 * sum(p.numel() * 4 for p in model.parameters())  # weights + their gradients
    budget = state + 6 * 64 * 256 * 4  # room for the activations of a 64-batch, not of a 1024-batch
    with pytest.raises(MemoryBudgetExceeded), \
            MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, budget_bytes=budget) as prof:
        for batch_size in (64, 64, 1024):
            zoo.train_step(model, optimizer, make_batch(batch_size))
            prof.record_stats()
    assert main(["report", str(prof.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "FAILED in iteration 2" in out
    assert "planner: chain of 5 stages" in out and "storing all activations, the step peaks at" in out


def test_report_of_a_run(capsys):
    assert main(["report", str(EXAMPLE_RUN), "--top", "2"]) == 0
    assert "run example" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--top", "-1"], "argument --top: must be a whole number >= 0, found '-1'"),
    (["--top", "many"], "argument --top: must be a whole number >= 0"),
    (["--iteration", "two"], "argument --iteration: invalid int value: 'two'"),
    (["--iteration", "99"], "has no iteration 99"),
])
def test_bad_options_are_one_line(capsys, argv, fragment):
    assert exit_code(["report", str(EXAMPLE_RUN), *argv]) == 2
    one_line_error(capsys, "memprof report: error:", fragment)


def test_report_of_an_iteration_without_detail_says_where_the_detail_is(tmp_path, capsys):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="long", print_period=0, detail_first=2,
                        detail_every=0, detail_peak_rise=100.0) as prof:
        for step in range(6):
            zoo.train_step(model, optimizer, make_batch(64 if step == 4 else 8))
            prof.record_stats()
    assert main(["report", str(prof.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "6 iterations, 2 with detail" in out and "memprof | iteration 4" in out  # the peak, summary only
    assert "iteration 4 kept its summary only" in out and "iteration 1 (the nearest with detail)" in out
    assert main(["report", str(prof.run_dir), "--iteration", "1"]) == 0
    out = capsys.readouterr().out
    assert "feature maps" in out and "kept its summary only" not in out  # the layers table is there
