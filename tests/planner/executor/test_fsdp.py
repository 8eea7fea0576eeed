"""Schedules under FSDP2 (``fully_shard``): two gloo ranks on CPU, gradients bitwise those of plain FSDP2.

FSDP2 gathers a module's parameters in hooks around its forward and before its backward; the executor's
recomputations during backward and the second module of a stage run outside those hooks, and gather the
parameters themselves (:mod:`planner.executor.sharded`). Every Linear is sharded on its own, and each stage
after the first is a Tanh followed by a Linear, so both cases occur: recomputed stages whose backward has not
begun, and a sharded module that is not its stage's first.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.memprof.test_distributed import _fsdp_reason, run_two_ranks

SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from planner import apply_schedule, min_feasible_budget
    from planner import solve
    from tests.planner import models as M
    from tests.planner.schedule_probe import ScheduleProbe

    out, algorithm, when = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(16, 16), nn.Tanh())][:-1])
    groups = [["0"]] + [[str(i), str(i + 1)] for i in range(1, len(base), 2)]  # (Tanh, Linear) after the first
    chain = M.chain(len(groups), groups)
    schedule = solve(chain, min_feasible_budget(chain, algorithm), algorithm)
    scheduled = copy.deepcopy(base)

    def shard(model):
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)

    shard(base)
    probe = ScheduleProbe(scheduled, schedule)
    if when == "before":  # the schedule applied to the model, which is sharded afterwards, or the other way round
        apply_schedule(scheduled, schedule)
        shard(scheduled)
    else:
        shard(scheduled)
        apply_schedule(scheduled, schedule)
    torch.manual_seed(100 + rank)  # each rank its own batches: the reduced gradients differ from the local ones
    results = []
    for step in range(2):
        x = torch.randn(8, 16)
        grads = []
        for model in (base, scheduled):
            model.zero_grad(set_to_none=True)
            model(x).pow(2).sum().backward()
            grads.append([p.grad.full_tensor() for p in model.parameters()])
        results.append(all(torch.equal(a, b) for a, b in zip(*grads)))
    probe.assert_ran(steps=2)
    recomputes = sum(op.kind.value == "F_ck" for op in schedule.ops)
    with open(f"{out}-{rank}.json", "w") as handle:
        json.dump({"equal": results, "recomputes": recomputes}, handle)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "when"), [("rotor", "before"), ("revolve", "after")])
def test_a_schedule_under_fsdp2_gives_plain_fsdp2s_gradients(tmp_path, algorithm: str, when: str) -> None:
    reason = _fsdp_reason("fully_shard")
    if reason:
        pytest.skip(reason)
    out = tmp_path / "result"
    run_two_ranks(tmp_path, SCRIPT, str(out), algorithm, when)
    results = [json.loads(Path(f"{out}-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(r["recomputes"] > 0 for r in results)  # the schedule does recompute
    assert [r["equal"] for r in results] == [[True, True], [True, True]]
