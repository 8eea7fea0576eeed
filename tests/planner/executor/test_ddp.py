"""Schedules under DistributedDataParallel: two gloo ranks on CPU, gradients bitwise those of plain DDP.

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

SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from planner import apply_schedule, solve, min_feasible_budget
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


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rotor", "revolve"])
def test_a_schedule_under_ddp_gives_plain_ddps_gradients(tmp_path, algorithm: str) -> None:
    out = tmp_path / "result"
    run_two_ranks(tmp_path, SCRIPT, str(out), algorithm)
    results = [json.loads(Path(f"{out}-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(r["recomputes"] > 0 for r in results)  # the schedule does recompute
    assert [r["equal"] for r in results] == [[True, True], [True, True]]
