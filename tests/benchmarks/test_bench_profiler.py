"""The profiler benchmark's pure parts: thread settings, the worker's stage table, the targets' verdicts."""

from __future__ import annotations

import pytest

from benchmarks import bench_profiler as bp


def _lane(tool: bp.Tool, wall: list[float], cpu: list[float], threads: int, stats: list[dict] | None = None) -> bp.Lane:
    lane = bp.Lane(bp.MODELS[1], threads, tool, None, None, None)  # type: ignore[arg-type]  # nothing is trained
    lane.wall_ms, lane.cpu_ms = [wall], [cpu]
    lane.call_ms, lane.child_cpu_ms, lane.start_ms, lane.stop_ms, lane.child_start_ms = [0.5], [1.0], [1], [1], [400]
    lane.stats = stats or []
    return lane


def test_thread_settings_put_zero_for_torchs_default_and_drop_repeats() -> None:
    expected = [1, bp.DEFAULT_THREADS] if bp.DEFAULT_THREADS != 1 else [1]
    assert bp.parse_threads("1,0") == expected
    assert bp.parse_threads(f"0,{bp.DEFAULT_THREADS}") == [bp.DEFAULT_THREADS]
    with pytest.raises(ValueError):
        bp.parse_threads("-1")
    with pytest.raises(ValueError):
        bp.parse_threads("two")


def test_the_worker_stats_of_several_blocks_add_up() -> None:
    cpu, counts = bp.merged_stats([{"cpu_s": {"analysis": 0.5, "start": 0.4}, "counts": {"records": 20}},
                                   {"cpu_s": {"analysis": 0.25}, "counts": {"records": 10, "flushes": 2}}])
    assert cpu == {"analysis": 0.75, "start": 0.4} and counts == {"records": 30, "flushes": 2}


def test_the_stage_table_is_per_record_and_the_start_per_run() -> None:
    stats = [{"cpu_s": {"analysis": 0.06, "journal read and decode": 0.02, "start": 0.4},
              "counts": {"records": 20, "detailed": 10, "gathers": 3, "flushes": 2}}] * 2
    lanes = {("cnn", 1): [_lane(bp.Tool(), [10.0], [10.0], 1), _lane(bp.Memprof(), [11.0], [12.0], 1, stats)]}
    table = "\n".join(bp.worker_table(lanes))
    assert "| analysis | 3.00 |" in table and "| journal read and decode | 1.00 |" in table
    assert "| **all but the start** | **4.00** |" in table
    assert "| start, once per run (CPU ms) | 400 |" in table
    assert "| records (detailed) / gathers / flushes | 40 (20) / 6 / 4 |" in table
    assert "| blocks whose records went to the training thread (from iteration) | 0 of 0 |" in table
    # two memprof lanes of one model: a column each, named by the tool
    other = [{"cpu_s": {"analysis": 0.12, "start": 0.4}, "counts": {"records": 20}}]
    lanes["cnn", 1].append(_lane(bp.MemprofEveryHook(), [12.0], [13.0], 1, other))
    table = "\n".join(bp.worker_table(lanes))
    assert "| cnn, 1 thr., memprof | cnn, 1 thr., memprof (every hook) |" in table
    assert "| analysis | 3.00 | 6.00 |" in table


def test_the_targets_are_judged_at_torchs_default_threads_against_torch_profiler() -> None:
    n = bp.DEFAULT_THREADS
    lanes = {("cnn", n): [_lane(bp.Tool(), [100.0], [100.0], n), _lane(bp.Memprof(), [104.0], [130.0], n),
                          _lane(bp.TorchProfiler(), [106.0], [120.0], n)]}
    (line,) = bp.target_lines(lanes)
    assert "wall (median step) 1.04x (target 1.05x: met; torch.profiler 1.06x: at or below it)" in line
    assert "wall (every step) 1.04x (target 1.05x: met; torch.profiler 1.06x: at or below it)" in line
    assert "CPU 1.30x (target 1.25x: missed; torch.profiler 1.20x: above it)" in line
    assert bp.target_lines({("cnn", n + 1): lanes["cnn", n]}) == ["- (memprof did not run at torch's default threads)"]
    lanes["cnn", n][2].cpu_ms = [[130.2]]  # equal to the hundredth: the verdict's digits shown
    assert "CPU 1.300x (target 1.25x: missed; torch.profiler 1.302x: at or below it)" in bp.target_lines(lanes)[0]


def test_the_switch_cell_counts_the_blocks_whose_records_left_the_worker() -> None:
    assert bp.switch_cell([None, 59, None, 51]) == "2 of 4 (51-59)"
    assert bp.switch_cell([59, None]) == "1 of 2 (59)"
    assert bp.switch_cell([None, None]) == "0 of 2"


def test_every_step_counts_the_rare_long_steps_that_the_median_leaves_out() -> None:
    """Two rounds; memprof's typical step is the baseline's, but one step in ten waits 20 ms for the worker."""
    n = bp.DEFAULT_THREADS
    base = _lane(bp.Tool(), [10.0] * 10, [10.0] * 10, n)
    base.wall_ms = [[10.0] * 10, [20.0] * 10]  # the second round ran on a busier machine: it compares with its own
    memprof = _lane(bp.Memprof(), [10.0] * 10, [10.0] * 10, n)
    memprof.wall_ms = [[10.0] * 9 + [30.0], [20.0] * 9 + [40.0]]
    assert bp._round_ratios(memprof, base, bp.WALL) == [1.0, 1.0]  # each round's median step: no cost
    assert bp._round_ratios(memprof, base, bp.WALL_MEAN) == pytest.approx([1.2, 1.1])
    assert bp._ratio(memprof, base, bp.WALL_MEAN) == pytest.approx(1.15)
    assert bp.ratio_cell(memprof, base, bp.WALL_MEAN) == "1.15x (1.10-1.20)"
    table = "\n".join(bp.summary_table({("cnn", n): [base, memprof]}, bp.WALL_MEAN))
    assert "| Baseline (mean ms/step) |" in table and "| 15.0 | 1.15x (1.10-1.20) |" in table
    (line,) = bp.target_lines({("cnn", n): [base, memprof]})
    assert "wall (median step) 1.33x" in line  # (pooled over both rounds' different levels)
    assert "wall (every step) 1.15x (target 1.05x: missed" in line
    memprof.call_ms = [0.5] * 9 + [20.5]  # the call that waited shows in the mean, not in the median
    row = next(line for line in bp.detail_table({("cnn", n): [base, memprof]}) if "| memprof |" in line)
    assert "| 0.50 | 2.50 |" in row


def test_a_batch_scale_shrinks_each_models_batch_and_says_so() -> None:
    from benchmarks.bench_profiler import MODELS, parse_args, scaled

    transformer = next(m for m in MODELS if m.name == "transformer")
    half = scaled(transformer, 0.5)
    assert (half.batch_size, half.name, half.build) == (4, "transformer", transformer.build)
    assert "batch 4" in half.sizes and "batch 8" not in half.sizes
    assert scaled(transformer, 0.01).batch_size == 1
    assert parse_args(["--batch-scale", "0.5"]).batch_scale == 0.5
    with pytest.raises(SystemExit):
        parse_args(["--batch-scale", "0"])
