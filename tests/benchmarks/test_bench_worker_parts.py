"""The issue-35 benchmarks' pure parts: the priority table, the timers, the worker-records table, and a tiny run."""

from __future__ import annotations

import pytest

from benchmarks import bench_step_parts as sp
from benchmarks import bench_worker_priority as wp
from benchmarks import bench_worker_records as wr


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
