"""Out-of-memory post-mortems: the budget guard, the flushed partial iteration, the report."""

from __future__ import annotations

import pytest
import torch

from examples import zoo
from memprof import MemoryBudgetExceeded, MemoryProfiler, ProfilerError, load_trace
from memprof.units import format_bytes


def _guarded_run(tmp_path, budget_bytes: int):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=4, width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(MemoryBudgetExceeded) as info, \
            MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, budget_bytes=budget_bytes) as prof:
        for _ in range(3):
            zoo.train_step(model, optimizer, make_batch(64))
            prof.record_stats()
    return prof, info.value


def test_budget_guard_raises_in_the_module_and_leaves_a_post_mortem(tmp_path):
    weights = sum(p.numel() * 4 for p in zoo.mlp(blocks=4, width=512)[0].parameters())
    budget = weights + 512 * 1024
    prof, error = _guarded_run(tmp_path, budget)
    assert format_bytes(budget) in str(error) and str(prof.run_dir) in str(error)
    trace = load_trace(prof.run_dir)
    failure = trace.meta["failure"]
    assert trace.meta["status"] == "failed"
    assert failure["kind"] == "budget" and failure["phase"] == "forward" and failure["module"] != ""
    assert failure["allocated_bytes"] > budget
    assert failure["categories"]["weights"] == weights
    assert failure["top_feature_maps"] and failure["top_feature_maps"][0]["feature_map_bytes"] > 0
    assert len(trace.iterations) == 1  # the partial iteration was flushed


def test_guard_rejects_a_bad_budget(tmp_path):
    with pytest.raises(ProfilerError, match="budget_bytes"):
        MemoryProfiler(torch.nn.Linear(2, 2), out_dir=tmp_path, budget_bytes=0)


def test_other_exceptions_are_not_post_mortems(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError), MemoryProfiler(model, out_dir=tmp_path, print_period=0) as prof:
        model(torch.randn(1, 2))
        raise ValueError("not about memory")
    meta = load_trace(prof.run_dir).meta
    assert meta["status"] == "closed" and "failure" not in meta


class _RunsOutOfMemory(torch.nn.Module):
    """Stands in for a layer whose allocation the device refuses: raises PyTorch's own OutOfMemoryError."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_error_leaves_a_post_mortem_and_is_re_raised(tmp_path, capsys):
    from cli.main import main

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), _RunsOutOfMemory())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(torch.OutOfMemoryError), \
            MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as prof:
        zoo.train_step(model, optimizer, (torch.randn(32, 256), torch.zeros(32, dtype=torch.long)))
        prof.record_stats()
    trace = load_trace(prof.run_dir)
    failure = trace.meta["failure"]
    assert trace.meta["status"] == "failed"
    assert failure["kind"] == "oom" and failure["module"] == "2" and failure["phase"] == "forward"
    assert "Tried to allocate 20.00 GiB" in failure["message"]
    # what filled memory: the weights, the input, and one 32 x 1024 feature map: the ReLU's output, which
    # autograd saves (the Linear's output was freed once the ReLU had consumed it)
    assert failure["categories"]["weights"] == (256 * 1024 + 1024) * 4
    assert failure["categories"]["inputs"] == 32 * 256 * 4
    assert failure["categories"]["feature_maps"] == 32 * 1024 * 4
    assert len(trace.iterations) == 1  # the failed step was flushed
    assert main(["report", str(prof.run_dir)]) == 0
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.gpu
def test_a_real_cuda_out_of_memory_is_recorded(tmp_path):
    class Greedy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.empty(2**50, dtype=torch.uint8, device=x.device)  # a petabyte: always refused

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), Greedy()).cuda()
    with pytest.raises(torch.OutOfMemoryError), MemoryProfiler(model, out_dir=tmp_path, print_period=0) as prof:
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        prof.record_stats()
    failure = load_trace(prof.run_dir).meta["failure"]
    assert failure["kind"] == "oom" and failure["module"] == "1"
    assert failure["categories"]["weights"] == 64 * 64 * 4 + 512  # the bias's 256 B sits in a 512 B block
