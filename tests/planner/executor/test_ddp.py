"""Schedules under DistributedDataParallel: two gloo ranks on CPU, gradients bitwise those of plain DDP, the
whole step's memory as predicted from a trace of the DDP model.

DDP reduces each parameter's gradient as autograd accumulates it; the executor runs a stage's backward (and
its recomputations) inside autograd's own backward, so DDP's hooks see every gradient once, in the order
the schedule makes them. Each rank trains on its own batch, so the all-reduced gradients differ from both
ranks' local ones: equal results mean the schedule's gradients took part in the reduction.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.memprof.test_distributed import run_two_ranks
from tests.memprof.test_distributed_categories import rebuild_lost_bytes

SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from planner import apply_schedule, min_feasible_budget
    from planner import solve
    from tests.planner import models as M
    from tests.planner.executor.helpers import chain_for
    from tests.planner.schedule_probe import ScheduleProbe

    out, algorithm = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = M.mlp(width=16, depth=6, seed=0)
    chain = chain_for(base)
    budget = None if algorithm == "store_all" else min_feasible_budget(chain, algorithm)
    schedule = solve(chain, budget, algorithm)
    scheduled = copy.deepcopy(base)
    probe = ScheduleProbe(scheduled, schedule)
    apply_schedule(scheduled, schedule)
    plain_ddp = nn.parallel.DistributedDataParallel(base)
    sched_ddp = nn.parallel.DistributedDataParallel(scheduled)
    torch.manual_seed(100 + rank)  # each rank its own batches
    results = []
    for step in range(2):
        x = torch.randn(8, 16)
        for model in (plain_ddp, sched_ddp):
            model.zero_grad(set_to_none=True)
            model(x).pow(2).sum().backward()
        plain = [p.grad for p in plain_ddp.parameters()]
        got = [p.grad for p in sched_ddp.parameters()]
        results.append(all(torch.equal(a, b) for a, b in zip(plain, got)))
    probe.assert_ran(steps=2)  # the executor ran every step, recomputations included
    recomputes = sum(op.kind.value == "F_ck" for op in schedule.ops)
    with open(f"{out}-{rank}.json", "w") as handle:
        json.dump({"equal": results, "recomputes": recomputes}, handle)
    dist.destroy_process_group()
    """
)


PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    import torch
    import torch.distributed as dist
    from torch import nn
    from memprof import MemoryProfiler, load_trace
    from memprof.capture.distributed import bucket_sizes
    from planner import apply_schedule, chain_from_trace, min_feasible_budget, store_all_budget
    from planner import solve
    from tests.allocator_truth import allocator_rise_bytes
    from tests.planner.schedule_probe import ScheduleProbe

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    inner = nn.Sequential(*[layer for _ in range(8) for layer in (nn.Linear(256, 256), nn.Tanh())])
    model = nn.parallel.DistributedDataParallel(inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    torch.manual_seed(1 + rank)
    batch = (torch.randn(512, 256), torch.randn(512, 256))

    def step():
        optimizer.zero_grad(set_to_none=True)
        (model(batch[0]) - batch[1]).pow(2).mean().backward()
        optimizer.step()

    def measured_step_peak():
        step()  # the first step after a change allocates what later ones reuse (DDP's buckets)
        optimizer.zero_grad(set_to_none=True)
        # what a step starts from: parameters, the batch and DDP's buckets, which no Python tensor holds
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (*model.parameters(), *batch)}
        return sum(held.values()) + sum(bucket_sizes(model)) + allocator_rise_bytes(step)

    with MemoryProfiler(model, optimizer, out_dir=tempfile.mkdtemp(), print_period=0, background=False) as profiler:
        for _ in range(3):
            profiler.mark_inputs(batch)
            step()
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    chain = chain_from_trace(trace)  # found in the DDP wrapper: stages name "module.0", ...
    store_all = solve(chain, store_all_budget(chain), "store_all")
    rotor = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    result = {"traced": int(trace.iterations.peak_allocated_bytes.iloc[-1]), "buckets": sum(bucket_sizes(model)),
              "store_all": [store_all.predicted_step_peak_bytes, measured_step_peak()]}
    probe = ScheduleProbe(inner, rotor)
    apply_schedule(inner, rotor)  # to the model inside the wrapper, as the chain's names say less the prefix
    result["rotor"] = [rotor.predicted_step_peak_bytes, measured_step_peak()]
    probe.assert_ran(steps=2)
    with open(f"{out}-{rank}.json", "w") as handle:
        json.dump(result, handle)
    print(rank, result)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_a_schedule_under_ddp_holds_the_predicted_step_peak(tmp_path) -> None:
    out = tmp_path / "result"
    run_two_ranks(tmp_path, PEAK_SCRIPT, str(out))
    for rank in (0, 1):
        result = json.loads(Path(f"{out}-{rank}.json").read_text())
        assert result["buckets"] == 8 * (256 * 256 + 256) * 4  # one gradient's worth, as comm_buffers
        predicted, measured = result["store_all"]
        # the profiled step, buckets included, is the allocator's; store-all replays it. (lost: the bytes DDP's
        # rebuild hands gloo's thread, whose free neither memprof nor torch.profiler sees: 68 B measured in CI)
        lost = rebuild_lost_bytes(parameters=16)
        assert abs(measured - result["traced"]) <= lost and abs(predicted - measured) <= lost, (rank, result)
        predicted, measured = result["rotor"]
        saving = result["store_all"][0] - predicted
        assert saving > 0.2 * predicted  # a real difference to tell apart
        # the bound is 5% + 1 MiB; measured 2.9% below the prediction here
        assert abs(measured - predicted) <= 0.05 * predicted, (rank, result)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rotor", "revolve"])
def test_a_schedule_under_ddp_gives_plain_ddps_gradients(tmp_path, algorithm: str) -> None:
    out = tmp_path / "result"
    run_two_ranks(tmp_path, SCRIPT, str(out), algorithm)
    results = [json.loads(Path(f"{out}-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(r["recomputes"] > 0 for r in results)  # the schedule does recompute
    assert [r["equal"] for r in results] == [[True, True], [True, True]]
