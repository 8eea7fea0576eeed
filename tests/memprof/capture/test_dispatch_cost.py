"""What a selective checkpoint adds per op, and the planning pass that stores it in meta.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from memprof import MemoryProfiler
from memprof.capture.dispatch_cost import selective_overhead_us


def test_a_selective_checkpoint_costs_time_per_op_on_cpu() -> None:
    """The policy runs in Python on every op of the forward and of the recomputation: on a CPU it costs
    more than nothing (about 15 us per op on the project's machine, twice a small op's forward + backward)."""
    overhead = selective_overhead_us("cpu", ops=50, repeats=5)
    assert math.isfinite(overhead) and overhead > 0.0


def _run(tmp_path: Path, run_id: str, ops: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with MemoryProfiler(model, None, out_dir=tmp_path, run_id=run_id, print_period=0, background=False,
                        ops=ops) as profiler:
        for _ in range(3):
            model(torch.randn(5, 8)).sum().backward()
            profiler.record_stats()
        live = json.loads((profiler.run_dir / "meta.json").read_text())
    assert "selective_overhead_us_per_op" not in live  # measured at close, after the allocator's stream stops
    return json.loads((profiler.run_dir / "meta.json").read_text())


def test_the_planning_pass_stores_the_overhead_at_close(tmp_path: Path) -> None:
    meta = _run(tmp_path, "ops", ops=True)
    assert meta["selective_overhead_us_per_op"] >= 0.0
    assert "selective_overhead_us_per_op" not in _run(tmp_path, "plain", ops=False)
