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
from torch import nn
from torch.nn import functional as F

from planner.errors import InvalidScheduleError
from planner.export.files import export_json, export_python
from planner.model.schedule import Op, Schedule
from planner.simulation.simulator import simulate
from tests.allocator_truth import allocator_rise_bytes
from tests.planner import models as M


def _load(tmp_path: Path, source: str, name: str = "apply_schedule") -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"exported_{name}_{abs(hash(str(tmp_path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_exported_file_trains_like_plain_autograd(tmp_path: Path, name: str) -> None:
    model = M.CNN()
    model(torch.randn(1, 3, 6, 6))
    length = len(model.features)
    chain = M.chain(length, [[f"features.{i}"] for i in range(length)])
    schedule = M.schedule(SCHEDULES[name](length), chain)
    exported = _load(tmp_path, export_python(schedule))
    assert [[f"features.{i}"] for i in range(length)] == exported.STAGES
    assert [tuple(op) for op in exported.OPS] == [(op.kind.value, op.stage) for op in schedule.ops]
    scheduled = copy.deepcopy(model)
    features = scheduled.features
    assert exported.apply_schedule(scheduled) is scheduled
    assert scheduled.features is features and type(features) is nn.Sequential  # changed in place
    assert "forward" in features[0].__dict__
    reference, got = _train(model), _train(scheduled)
    assert all(torch.equal(a, b) for a, b in zip(reference[0], got[0]))
    assert list(reference[1]) == list(got[1])
    assert all(torch.equal(value, got[1][key]) for key, value in reference[1].items())
    assert torch.equal(reference[2], got[2])


@pytest.mark.parametrize("name", ["store_all", "revolve", "wasted"])
def test_exported_file_on_a_model_calling_its_blocks_in_a_loop_with_keywords(tmp_path: Path, name: str) -> None:
    model = M.LoopModel()
    chain = M.chain(len(model.blocks), [[f"blocks.{i}"] for i in range(len(model.blocks))])
    exported = _load(tmp_path, export_python(M.schedule(SCHEDULES[name](len(model.blocks)), chain)))
    x = torch.randn(5, 6)
    grads = []
    for net in (model, exported.apply_schedule(copy.deepcopy(model))):
        torch.manual_seed(3)
        net.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(a is not None and torch.equal(a, b) for a, b in zip(*grads))


def test_exported_file_hands_a_carried_tensors_gradient_on_as_plain_autograd_does(tmp_path: Path) -> None:
    """The encoder's output, read twice by each of 5 blocks: the embedded runtime adds its 10 parts in plain
    autograd's order (bitwise), under a schedule that recomputes."""
    model = M.CrossModel(same_tensor_twice=True)
    chain = M.chain(5, [[f"blocks.{i}"] for i in range(5)])
    exported = _load(tmp_path, export_python(M.schedule(M.revolve(5), chain)))
    x = torch.randn(16, 8)
    grads = []
    for net in (model, exported.apply_schedule(copy.deepcopy(model))):
        net.zero_grad(set_to_none=True)
        net(x).square().sum().backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(a is not None and torch.equal(a, b) for a, b in zip(*grads))


def test_exported_file_for_a_transformer_and_an_unnamed_chain(tmp_path: Path) -> None:
    model = M.transformer()
    schedule = M.schedule(M.revolve(len(model)), M.chain(len(model)))
    exported = _load(tmp_path, export_python(schedule))
    assert exported.STAGES is None
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, 11, (10,), generator=torch.Generator().manual_seed(1))
    grads = []
    for net in (model, exported.apply_schedule(copy.deepcopy(model))):
        torch.manual_seed(2)
        F.cross_entropy(net(ids).flatten(0, 1), target).backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    nested = nn.Module()
    nested.body = copy.deepcopy(model)
    exported.apply_schedule(nested, container="body")
    assert all("forward" in child.__dict__ for child in nested.body)


def test_exported_file_refuses_another_model(tmp_path: Path) -> None:
    schedule = M.schedule(M.store_all(3), M.chain(3, [["body.0"], ["body.1"], ["body.2"]]))
    exported = _load(tmp_path, export_python(schedule))
    model = nn.Module()
    model.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(ValueError, match=r"made for a model with modules \[\['body.0'\], \['body.1'\], \['body.2'\]\]"):
        exported.apply_schedule(model)
    unnamed = _load(tmp_path, export_python(M.schedule(M.store_all(3), M.chain(3))), "unnamed")
    with pytest.raises(ValueError, match="this schedule has 3 stages; the model offers 2"):
        unnamed.apply_schedule(model, container="body")


def test_export_errors() -> None:
    broken = M.schedule([Op(M.B, 1)], M.chain(1))
    with pytest.raises(InvalidScheduleError, match=r"op 0 B\(1\): needs"):
        export_python(broken)
    early = [Op(M.CK, 1), Op(M.CK, 1), Op(M.A, 2), Op(M.A, 3), Op(M.B, 3), Op(M.B, 2), Op(M.A, 1), Op(M.B, 1)]
    with pytest.raises(InvalidScheduleError, match="the executor cannot run this schedule"):
        export_python(M.schedule(early, M.chain(2)))


def test_export_json_carries_the_prediction() -> None:
    _, chain, _, _ = M.measured_mlp(depth=4)
    schedule = M.schedule(M.revolve(4), chain)
    data = json.loads(export_json(schedule))
    prediction = simulate(chain, schedule)
    assert data["predicted_peak_bytes"] == prediction.peak_bytes
    assert data["predicted_makespan_ms"] == pytest.approx(prediction.makespan_ms)
    again = Schedule.from_json(data)
    assert again.ops == schedule.ops and again.chain == chain


def test_exported_file_holds_about_the_predicted_memory(tmp_path: Path) -> None:
    model, chain, x, target = M.measured_mlp()
    a = chain.input_bytes
    depth = chain.length
    for index, ops in enumerate((M.store_all(depth), M.periodic(depth, 3), M.revolve(depth))):
        schedule = M.schedule(ops, chain)
        exported = _load(tmp_path, export_python(schedule), f"apply_{index}")
        net = exported.apply_schedule(copy.deepcopy(model))
        (net(x) * target).sum().backward()
        net.zero_grad(set_to_none=False)
        measured = allocator_rise_bytes(lambda net=net: (net(x) * target).sum().backward()) + a
        predicted = simulate(chain, schedule).peak_bytes
        assert abs(measured - predicted) <= 0.02 * predicted, (index, measured, predicted)
