"""The hook-floor benchmark's table: medians, and each setting's difference from the bare step's."""

from __future__ import annotations

from benchmarks import bench_hook_floor as bf


def test_the_table_gives_each_settings_median_above_the_bare_steps() -> None:
    found = {"bare": [10.0, 30.0, 20.0], "empty hooks": [21.0, 22.0, 23.0], "+ node pre-hooks": [23.5, 23.5, 0.0],
             "memprof's hooks": [25.0, 24.0, 26.0]}
    lines = bf.table({"mlp": found})
    assert lines[0] == "| Model | bare | empty hooks | + node pre-hooks | memprof's hooks |"
    assert lines[2] == "| mlp | 20.00 ms | +2.00 ms | +3.50 ms | +5.00 ms |"
