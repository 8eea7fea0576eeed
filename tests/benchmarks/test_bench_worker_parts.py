"""The issue-35 benchmarks' pure parts: the priority table, the timers, the worker-records table, and tiny runs."""

from __future__ import annotations

import time
from functools import partial

import pytest

from benchmarks import bench_step_parts as sp
from benchmarks import bench_worker_priority as wp
from benchmarks import bench_worker_records as wr
from benchmarks.bench_profiler import ModelSpec
from examples import zoo
from memprof.capture import worker_judge


def test_the_priority_table_gives_each_priority_against_the_bare_step() -> None:
    lanes = {"none": wp.Lane([10.0, 10.0], [20.0, 20.0]),
             "idle": wp.Lane([11.0, 11.0], [22.0, 22.0], [0.5, 0.6], [2.0, 2.0])}
    args = wp.parse_args(["--cycles", "1"])
    table = wp.report(lanes, args)
    assert "| no memprof | 10.00 | 20.00 | | | |" in table
    assert "| idle | 11.00 (1.10x) | 22.00 | 2.00 | 1.20x | 0.55 |" in table


def test_a_segment_must_outlast_its_settling_steps() -> None:
    with pytest.raises(SystemExit):
        wp.parse_args(["--segment", "10", "--settle", "10"])


def test_timed_methods_count_their_calls_and_are_put_back() -> None:
    class Box:
        def work(self, x: int) -> int:
            return x + 1

    spent: dict[str, float] = {"work": 0.0}
    calls: dict[str, int] = {"work": 0}
    original = Box.work
    with sp.timed(Box, ["work"], spent, calls, lambda: 1.0):
        assert Box().work(1) == 2 and Box().work(2) == 3
    assert calls["work"] == 2 and Box.work is original


def test_the_worker_records_table_takes_each_codes_best_pass() -> None:
    slow = {"total": 0.4, "records": 10, "cpu_s": {"analysis": 0.3, "journal read and decode": 0.05,
                                                    "flush: iterations part": 0.02, "flush: state, journal clean-up": 0.01}}
    fast = {**slow, "total": 0.2}
    table = "\n".join(wr.report({"mlp|this": [slow, fast]}))
    assert "| mlp | this | 20.00 | 30.00 | 5.00 | 3.00 |" in table


@pytest.mark.slow
def test_the_step_parts_run_on_a_small_model(capsys) -> None:
    sp.main(["--model", "mlp", "--steps", "2", "--pairs", "2"])
    out = capsys.readouterr().out
    assert "| all hooks |" in out and "| `record_stats()` |" in out and "by pairs" in out


def test_the_parts_after_a_switch_are_measured_on_the_training_thread() -> None:
    tiny = ModelSpec("tiny", partial(zoo.mlp, blocks=1, width=8, in_features=8), 4, "1 block, width 8")
    before = worker_judge.SETTLE_RECORDS, worker_judge.JUDGE_RECORDS, worker_judge.INLINE_WAIT_SHARE
    rows = sp.switched_costs(tiny, steps=16, clock=time.process_time, warmup=48)
    assert before == (worker_judge.SETTLE_RECORDS, worker_judge.JUDGE_RECORDS, worker_judge.INLINE_WAIT_SHARE)
    assert rows[0].startswith("| `record_stats()` after a switch |")
    spent = {row.split(" | ")[0][2:]: float(row.split(" | ")[1]) for row in rows}
    assert spent["the analysis (gathers of 8)"] > 0 and spent["the journal append"] > 0
    assert spent["`record_stats()` after a switch"] >= spent["the analysis (gathers of 8)"]
