"""A ``MemoryProfiler`` whose constructor raises leaves nothing behind: no run directory, no hook, no slot."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, ProfilerError, load_trace


class _BrokenHooks(torch.optim.SGD):
    """An optimizer whose step hooks cannot be registered: the constructor fails after the model's hooks."""

    def register_step_pre_hook(self, hook: Any) -> Any:
        raise RuntimeError("this optimizer takes no hooks")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _hook_count(model: nn.Module) -> int:
    count = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return count + sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())


def test_a_failed_start_leaves_no_run_directory_no_hook_and_a_free_slot(tmp_path) -> None:
    model = _model()
    out = tmp_path / "traces"  # created by the profiler, so removed with the run
    with pytest.raises(RuntimeError, match="takes no hooks"):
        MemoryProfiler(model, _BrokenHooks(model.parameters(), lr=0.1), out_dir=out, run_id="broken")
    assert not out.exists()
    assert _hook_count(model) == 0
    # the model is free and the profiler slot too: a working profiler attaches and records
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=out, print_period=0, background=False) as profiler:
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        profiler.record_stats()
    assert len(load_trace(profiler.run_dir).iterations) == 1


def test_a_failed_start_keeps_the_folders_it_did_not_create(tmp_path) -> None:
    model = _model()
    (tmp_path / "earlier-run").mkdir()
    (tmp_path / "earlier-run" / "notes.txt").write_text("mine")
    for run_id in ("broken", "earlier-run"):  # a new folder, and a folder of the user's that holds no trace
        with pytest.raises(RuntimeError, match="takes no hooks"):
            MemoryProfiler(model, _BrokenHooks(model.parameters(), lr=0.1), out_dir=tmp_path, run_id=run_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier-run"]
    assert sorted(p.name for p in (tmp_path / "earlier-run").iterdir()) == ["notes.txt"]


def test_a_refused_optimizer_leaves_nothing_either(tmp_path) -> None:
    model = _model()
    with pytest.raises(ProfilerError, match="Pass the torch.optim.Optimizer it wraps"):
        MemoryProfiler(model, object(), out_dir=tmp_path / "traces")  # type: ignore[arg-type]
    assert not (tmp_path / "traces").exists() and _hook_count(model) == 0
