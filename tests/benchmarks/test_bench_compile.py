"""A smoke run of ``benchmarks/bench_compile.py``: the table it prints, and the points it keeps for the dashboard."""

from __future__ import annotations

import pytest

from planner import read_compile_points

pytestmark = pytest.mark.slow


def test_a_quick_run_prints_both_variants_and_keeps_the_partitioners_points(tmp_path, capsys) -> None:
    from benchmarks.bench_compile import main

    main(["--quick", "--budgets", "1.0,0.1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| budget | variant | knob") and len(rows) == 2 + 3 * 2 + 2  # header, rule, rows
    assert [r.split(" | ")[1] for r in rows[2:5]] == ["partitioner", "memprof", "memprof+knob"]
    # the least budget always has a plan: its prediction beside its measure
    assert rows[-1].startswith("| least | memprof+knob |") and "(" in rows[-1].split(" | ")[3]
    points = read_compile_points(tmp_path / "GPT2LMHeadModel-budget-1.0")
    assert [p.activation_memory_budget for p in points] == [1.0, 0.1]
    assert all(p.step_peak_bytes > 0 and p.step_ms > 0 and p.flops == 0 for p in points)
