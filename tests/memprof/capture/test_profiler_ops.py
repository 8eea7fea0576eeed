"""MemoryProfiler(ops=True): the ops of exactly one iteration in the trace, and no cost left on the others."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from memprof.errors import ProfilerError

F32 = 4


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _steps(model: nn.Module, profiler: MemoryProfiler, steps: int, seen: list[int] | None = None) -> None:
    optimizer = profiler.optimizer
    assert optimizer is not None
    for _ in range(steps):
        model(torch.randn(5, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if seen is not None:
            seen.append(_hooks(model))
        profiler.record_stats()


@pytest.mark.parametrize("background", [True, False])
def test_ops_are_recorded_for_exactly_one_iteration(tmp_path: Path, background: bool) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # (every hook in every step: the count below is the planning pass's, not the submodules' in steady steps)
    plain = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="plain", print_period=0, background=background,
                           steady=False)
    hooks_plain = _hooks(model)
    plain.close()
    seen: list[int] = []
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="ops", print_period=0, background=background,
                        ops=True, detail_first=0, detail_every=0, detail_peak_rise=1e9, steady=False) as profiler:
        _steps(model, profiler, 4, seen)
    trace = load_trace(profiler.run_dir)
    assert trace.op_iterations == [1]
    assert len(trace.read("ops")) == len(trace.op_records(1)) == 5
    records = trace.op_records()
    assert [r.op for r in records] == ["aten.t.default", "aten.addmm.default", "aten.relu.default",
                                       "aten.t.default", "aten.addmm.default"]
    assert [r.needs for r in records] == [(), (), (2,), (), (2,)]
    assert records[1].output_bytes == 5 * 16 * F32 and records[1].flops == 2 * 5 * 8 * 16
    # the recorded iteration keeps its detail, whatever the policy says (here: none past the first)
    assert 1 in trace.detail_iterations and not {2, 3} & set(trace.detail_iterations)
    # the two waiting hooks on the root are gone once the pass ran: later steps carry the plain profiler's
    assert seen[0] == hooks_plain + 2
    assert seen[1] == seen[2] == seen[3] == hooks_plain
    assert _hooks(model) == 0


def test_without_ops_there_is_no_table(tmp_path: Path) -> None:
    model = _model()
    with MemoryProfiler(model, torch.optim.SGD(model.parameters(), lr=0.1), out_dir=tmp_path,
                        print_period=0, background=False) as profiler:
        _steps(model, profiler, 2)
    assert not (profiler.run_dir / "ops.parquet").exists()
    assert load_trace(profiler.run_dir).op_records() == []


def test_ops_iteration_zero_and_a_run_too_short(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="first", print_period=0, background=False,
                        ops=True, ops_iteration=0) as profiler:
        _steps(model, profiler, 2)
    assert load_trace(profiler.run_dir).op_iterations == [0]
    with pytest.warns(RuntimeWarning, match="recorded no ops"), MemoryProfiler(
            model, optimizer, out_dir=tmp_path, run_id="short", print_period=0, background=False, ops=True,
            ops_iteration=5) as profiler:
        _steps(model, profiler, 2)
    assert load_trace(profiler.run_dir).op_records() == []
    assert _hooks(model) == 0


def test_a_forward_that_raises_in_the_recorded_iteration_leaves_nothing_running(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False, ops=True,
                            ops_iteration=0) as profiler:
            with pytest.raises(RuntimeError):
                model(torch.randn(5, 7))
            profiler.record_stats()
            _steps(model, profiler, 1)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert load_trace(profiler.run_dir).op_records() == []
    assert _hooks(model) == 0


@pytest.mark.parametrize(("kwargs", "message"), [({"ops": "yes"}, "ops must be True or False"),
                                                 ({"ops": True, "ops_iteration": -1}, "ops_iteration")])
def test_bad_ops_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    model = _model()
    with pytest.raises(ProfilerError, match=message):
        MemoryProfiler(model, out_dir=tmp_path, print_period=0, background=False, **kwargs)
