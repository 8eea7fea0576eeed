"""torch.compile's partitioner, measured as the baseline of selective recomputation, and its file beside a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from planner.errors import ChainError
from planner.measure.compile_baseline import (
    COMPILE_POINTS_FILE,
    CompilePoint,
    measure_compile,
    read_compile_points,
    write_compile_points,
)
from tests.cli.helpers import exit_code

FACTORIES = Path(__file__).parents[2] / "cli" / "ops_factories.py"


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))]
    return nn.Sequential(*layers), torch.randn(32, 64)


def test_lower_budgets_hold_less_and_recompute_more() -> None:
    model, x = _mlp()
    with FlopCounterMode(display=False) as counter:
        model(x).square().mean().backward()
    eager = counter.get_total_flops()
    points = measure_compile(model, lambda f: f(x).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1),
                             budgets=(1.0, 0.1), repeats=1)
    full, low = points
    assert full.flops == eager  # nothing recomputed at the partitioner's default budget
    assert low.held_bytes < full.held_bytes and low.flops > full.flops
    params = sum(p.numel() * 4 for p in model.parameters())
    assert full.step_peak_bytes > 2 * params  # weights and their gradients are in the step's peak
    assert all(p.step_ms > 0 for p in points)


def test_a_steps_peak_is_the_profilers() -> None:
    """The step's peak, batch included, against memprof's own (the allocator to the byte): before, the gradients of
    the previous step, allocated before torch.profiler started, were counted as held although ``zero_grad`` freed
    them (+68,608 B here, +67 MiB on a 6-layer GPT-2 of width 256)."""
    import tempfile
    import warnings

    from memprof import MemoryProfiler, load_trace
    from planner.measure.compile_baseline import measure_step

    model, x = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    peak, _, _ = measure_step(lambda: model(x).square().mean(), model, optimizer, repeats=1, batch=(x,))
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with MemoryProfiler(model, optimizer, out_dir=out, print_period=0, background=False) as profiler:
            for _ in range(2):
                optimizer.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                optimizer.step()
                profiler.record_stats()
        profiled = int(load_trace(profiler.run_dir).iterations.peak_allocated_bytes.iloc[-1])
    assert peak == profiled, (peak, profiled)


def test_points_round_trip_and_a_bad_file_is_one_clear_error(tmp_path: Path) -> None:
    assert read_compile_points(tmp_path) == []
    points = [CompilePoint(activation_memory_budget=0.5, step_peak_bytes=10, held_bytes=4, flops=7, step_ms=1.5)]
    write_compile_points(tmp_path, points)
    assert read_compile_points(tmp_path) == points
    (tmp_path / COMPILE_POINTS_FILE).write_text(json.dumps({"points": [{"step_ms": 1}]}))
    with pytest.raises(ChainError, match="not a list of torch.compile points"):
        read_compile_points(tmp_path)


def test_profile_ops_compile_baseline_writes_the_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = exit_code(["profile-ops", f"{FACTORIES}:mlp", "--batch-size", "5", "--out", str(tmp_path),
                      "--run-id", "mlp", "--optimizer", "sgd", "--compile-baseline"])
    out = capsys.readouterr().out
    assert code == 0
    points = read_compile_points(tmp_path / "mlp")
    assert [p.activation_memory_budget for p in points] == [1.0, 0.5, 0.3, 0.1]
    assert "torch.compile (min-cut partitioner)" in out and "budget 0.1" in out
