"""Export: the standalone file needs only torch, gives plain gradients, and holds the predicted memory."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from planner.errors import InvalidScheduleError
from planner.export import export_json, export_python, nested_plan
from planner.schedule import Op, Schedule
from planner.simulator import simulate
from tests.planner import models as M


def _load(tmp_path: Path, source: str, name: str = "apply_schedule") -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"exported_{name}_{abs(hash(str(tmp_path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ops_of_plan(plan: list, length: int, top: bool = True) -> list[Op]:
    """Reference expansion of a nested plan back to operations (the inverse of ``nested_plan``)."""
    if not plan:
        return [Op(M.A, length + 1), Op(M.B, length + 1)] if top else []
    head, rest = plan[0], plan[1:]
    if isinstance(head, int):
        return [Op(M.A, head), *_ops_of_plan(rest, length, top), Op(M.B, head)]
    stages = _flatten(head)
    forward = [Op(M.CK, stages[0])] + [Op(M.NONE, s) for s in stages[1:]]
    return forward + _ops_of_plan(rest, length, top) + _ops_of_plan(head, length, False)


def _flatten(plan: list) -> list[int]:
    return [s for item in plan for s in ([item] if isinstance(item, int) else _flatten(item))]


def test_nested_plans_of_known_schedules() -> None:
    chain = M.chain(6)
    assert nested_plan(M.schedule(M.store_all(6), chain)) == [1, 2, 3, 4, 5, 6]
    assert nested_plan(M.schedule(M.periodic(6, 2), chain)) == [[1, 2], [3, 4], 5, 6]
    assert nested_plan(M.schedule(M.revolve(6), chain)) == [[[1], [2], 3], [[4], 5], [6]]
    wasted = M.with_wasted_recomputations(M.store_all(6), random.Random(0), 3)
    assert nested_plan(M.schedule(wasted, chain)) is None


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_nested_plan_expands_back_to_the_same_operations(length: int, seed: int) -> None:
    ops = M.random_persistent(length, random.Random(seed))
    plan = nested_plan(M.schedule(ops, M.chain(length)))
    assert plan is not None
    assert _flatten(plan) == list(range(1, length + 1))
    assert _ops_of_plan(plan, length) == ops


def test_the_file_imports_only_torch_and_the_standard_library() -> None:
    for ops in (M.revolve(5), M.with_wasted_recomputations(M.revolve(5), random.Random(1), 4)):
        tree = ast.parse(export_python(M.schedule(ops, M.chain(5))))
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots.add(node.module.split(".")[0])
        assert "torch" in roots
        assert roots - {"torch"} <= set(sys.stdlib_module_names), roots
        assert not roots & {"planner", "memprof", "dashboard"}


SCHEDULES = {
    "store_all": M.store_all,
    "periodic": lambda n: M.periodic(n, 3),
    "revolve": M.revolve,
    "random": lambda n: M.random_persistent(n, random.Random(7)),
    "wasted": lambda n: M.with_wasted_recomputations(M.random_persistent(n, random.Random(7)), random.Random(8), 5),
}


def _train(model: nn.Module, steps: int = 2) -> tuple[list, dict, torch.Tensor]:
    torch.manual_seed(11)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for _ in range(steps):
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), torch.randint(0, 3, (2,)))
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()] + [x.grad])
        optimizer.step()
        losses.append(loss.detach())
    return losses + [g for step in grads for g in step], model.state_dict(), torch.get_rng_state()


@pytest.mark.parametrize(("name", "mode"), [(name, "auto") for name in SCHEDULES] + [("revolve", "executor")])
def test_exported_file_trains_like_plain_autograd(tmp_path: Path, name: str, mode: str) -> None:
    model = M.CNN()
    model(torch.randn(1, 3, 6, 6))
    length = len(model.features)
    chain = M.chain(length, [[f"features.{i}"] for i in range(length)])
    schedule = M.schedule(SCHEDULES[name](length), chain)
    exported = _load(tmp_path, export_python(schedule, mode=mode))
    assert exported.CONTAINER == "features"
    assert (exported.PLAN is not None) == (mode == "auto" and name != "wasted")
    scheduled = copy.deepcopy(model)
    features = scheduled.features
    assert exported.apply_schedule(scheduled) is scheduled
    assert scheduled.features is features and type(features).__name__ == "ScheduledSequential"
    reference, got = _train(model), _train(scheduled)
    assert all(torch.equal(a, b) for a, b in zip(reference[0], got[0]))
    assert list(reference[1]) == list(got[1])
    assert all(torch.equal(value, got[1][key]) for key, value in reference[1].items())
    assert torch.equal(reference[2], got[2])


def test_exported_file_for_a_transformer_and_an_unnamed_chain(tmp_path: Path) -> None:
    model = M.transformer()
    schedule = M.schedule(M.revolve(len(model)), M.chain(len(model)))
    exported = _load(tmp_path, export_python(schedule, mode="checkpoint"))
    assert exported.STAGES is None and exported.CONTAINER == ""
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, 11, (10,), generator=torch.Generator().manual_seed(1))
    grads = []
    for net in (model, exported.apply_schedule(copy.deepcopy(model))):
        torch.manual_seed(2)
        F.cross_entropy(net(ids).flatten(0, 1), target).backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_exported_file_refuses_another_container(tmp_path: Path) -> None:
    schedule = M.schedule(M.store_all(3), M.chain(3, [["body.0"], ["body.1"], ["body.2"]]))
    exported = _load(tmp_path, export_python(schedule))
    model = nn.Module()
    model.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(ValueError, match=r"runs modules \['0', '1', '2'\].*children are \['0', '1'\]"):
        exported.apply_schedule(model)
    model.body = nn.ModuleList([nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="body is a ModuleList; expected an nn.Sequential"):
        exported.apply_schedule(model)


def test_export_modes_and_errors() -> None:
    wasted = M.schedule(M.with_wasted_recomputations(M.revolve(4), random.Random(3), 4), M.chain(4))
    with pytest.raises(InvalidScheduleError, match="not persistent"):
        export_python(wasted, mode="checkpoint")
    with pytest.raises(ValueError, match="mode must be one of"):
        export_python(wasted, mode="fast")
    broken = M.schedule([Op(M.B, 1)], M.chain(1))
    with pytest.raises(InvalidScheduleError, match=r"operation 0 \(B\(1\)\)"):
        export_python(broken)


def test_export_json_carries_the_prediction() -> None:
    _, chain, _, _ = M.measured_mlp(depth=4)
    schedule = M.schedule(M.revolve(4), chain)
    data = json.loads(export_json(schedule))
    prediction = simulate(chain, schedule)
    assert data["predicted_peak_bytes"] == prediction.peak_bytes
    assert data["predicted_makespan_ms"] == pytest.approx(prediction.makespan_ms)
    again = Schedule.from_json(data)
    assert again.ops == schedule.ops and again.chain == chain


@pytest.mark.parametrize("mode", ["checkpoint", "executor"])
def test_exported_file_holds_about_the_predicted_memory(tmp_path: Path, mode: str) -> None:
    model, chain, x, target = M.measured_mlp()
    depth, a = chain.length, chain.input_bytes
    for index, ops in enumerate((M.store_all(depth), M.periodic(depth, 3), M.revolve(depth))):
        schedule = M.schedule(ops, chain)
        exported = _load(tmp_path, export_python(schedule, mode=mode), f"apply_{index}")
        net = exported.apply_schedule(copy.deepcopy(model))
        (net(x) * target).sum().backward()
        net.zero_grad(set_to_none=False)
        measured = M.peak_cpu_bytes(lambda net=net: (net(x) * target).sum().backward()) + a
        predicted = simulate(chain, schedule).peak_bytes
        # torch.utils.checkpoint also keeps the CPU RNG state (5 KiB, host memory on a GPU) of each segment.
        segments = _count_segments(exported.PLAN) if exported.PLAN is not None else 0
        assert 0.95 * predicted <= measured <= 1.02 * predicted + 6 * 1024 * segments, (index, measured, predicted)


def _count_segments(plan: list) -> int:
    return sum(1 + _count_segments(item) for item in plan if isinstance(item, list))
