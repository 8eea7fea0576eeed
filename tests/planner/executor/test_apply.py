"""``apply_schedule`` and ``remove_schedule``: finding the stages in the model, in place, and the schedules refused."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

from planner.errors import InvalidScheduleError, ScheduleMismatchError
from planner.executor import CheckpointedSequential, apply_schedule, remove_schedule, validate_ops
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op
from planner.simulation.simulator import simulate
from tests.planner import models as M
from tests.planner.executor.helpers import assert_same_step, chain_for, cnn_case, run_step
from tests.planner.executor.test_offload import blocks, offload_all, wide_chain
from tests.planner.executor.test_weights import streamed, weighted


def test_remove_schedule_gives_the_modules_their_own_forward_back() -> None:
    model = M.LoopModel()
    scheduled = apply_schedule(model, M.schedule(M.revolve(4), M.chain(4, [[f"blocks.{i}"] for i in range(4)])))
    assert scheduled is model and all("forward" in block.__dict__ for block in model.blocks)
    assert remove_schedule(model) is model
    assert not any("forward" in block.__dict__ for block in model.blocks)
    assert remove_schedule(model) is model  # a no-op the second time
    reference = run_step(M.LoopModel(), torch.ones(2, 6), lambda out: out.sum())
    assert_same_step(reference, run_step(model, torch.ones(2, 6), lambda out: out.sum()))


@pytest.mark.parametrize("name", ["revolve", "offload", "streamed"])
def test_a_dropped_scheduled_model_is_freed_at_once(name: str) -> None:
    """No reference cycle through the wrappers: its parameters (device memory, on a GPU) go with the model,
    not whenever the garbage collector next runs; a block kept from it runs as its own module."""
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    schedule = {"revolve": M.schedule(M.revolve(4), chain), "offload": M.schedule(offload_all(4), chain),
                "streamed": streamed(offload_all(4), chain, [1, 3])}[name]
    x = torch.randn(8, 16)
    gc.disable()
    try:
        model = CheckpointedSequential(blocks(), schedule)
        run_step(model, x, lambda out: out.square().sum())
        kept = model[1]
        dropped = weakref.ref(model), weakref.ref(model[0][0].weight)
        del model
        assert dropped[0]() is None and dropped[1]() is None
        assert torch.equal(kept(torch.ones(2, 16)), kept.__class__.forward(kept, torch.ones(2, 16)))
    finally:
        gc.enable()


def test_a_forward_set_on_the_instance_comes_back_on_removal() -> None:
    """accelerate (and users' patches) put a ``forward`` on the module instance: removing the schedule gives that
    one back, not the class's."""
    import types

    model = M.LoopModel()
    block = model.blocks[1]
    patched = types.MethodType(lambda self, *args, **kwargs: type(self).forward(self, *args, **kwargs), block)
    block.forward = patched
    schedule = M.schedule(M.revolve(4), M.chain(4, [[f"blocks.{i}"] for i in range(4)]))
    apply_schedule(model, schedule)
    assert block.__dict__["forward"] is not patched
    reference = run_step(M.LoopModel(), torch.ones(2, 6), lambda out: out.sum())
    assert_same_step(reference, run_step(model, torch.ones(2, 6), lambda out: out.sum()))
    remove_schedule(model)
    assert block.__dict__["forward"] is patched
    assert "forward" not in model.blocks[0].__dict__


def test_schedule_for_another_length_is_refused() -> None:
    with pytest.raises(ScheduleMismatchError, match=r"3 stages but the model has 4 children"):
        CheckpointedSequential(M.mlp(depth=2), M.schedule(M.store_all(3), M.chain(3)))


def test_schedule_naming_other_modules_is_refused() -> None:
    schedule = M.schedule(M.store_all(2), M.chain(2, [["0"], ["2"]]))
    with pytest.raises(ScheduleMismatchError, match=r"the model has no module '2'"):
        CheckpointedSequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), schedule)


class _TwoParents(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_names_under_several_parents_work_and_partly_missing_names_are_refused() -> None:
    model = _TwoParents()
    x = torch.randn(2, 3)
    reference = run_step(model, x, lambda out: out.sum())
    chain = M.chain(4, [["a.0"], ["a.1"], ["b.0"], ["b.1"]])
    scheduled = apply_schedule(copy.deepcopy(model), M.schedule(M.revolve(4), chain))
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.sum()))
    twice = M.chain(2, [["a.0"], ["a.0"]])
    with pytest.raises(ScheduleMismatchError, match="one module in two places"):
        apply_schedule(copy.deepcopy(model), M.schedule(M.store_all(2), twice))
    chain = M.chain(2, [["0"], ["1"]])
    mixed = Chain(chain.name, chain.input_bytes, (chain.stages[0], Stage(1.0, 1.0, 1, 1, 1), chain.stages[2]))
    with pytest.raises(ScheduleMismatchError, match=r"stages \[2\] name no modules"):
        apply_schedule(M.mlp(depth=1), M.schedule(M.store_all(2), mixed))


def test_invalid_operations_are_refused_naming_the_first_bad_one() -> None:
    model = M.mlp(width=2, depth=1)
    ops = [Op(M.CK, 1), Op(M.NONE, 2), Op(M.A, 3), Op(M.B, 3), Op(M.B, 2), Op(M.A, 1), Op(M.B, 1)]
    with pytest.raises(InvalidScheduleError, match=r"op 4 B\(2\): needs a-bar\^2"):
        CheckpointedSequential(model, M.schedule(ops, M.chain(2)))
    with pytest.raises(InvalidScheduleError, match=r"op 4 B\(2\): needs a-bar\^2"):
        validate_ops(ops, 2)
    loss_twice = [Op(M.A, 1), Op(M.A, 2), Op(M.A, 3), Op(M.CK, 3), Op(M.B, 3), Op(M.B, 2), Op(M.B, 1)]
    with pytest.raises(InvalidScheduleError, match=r"the loss \(stage 3\) must appear as F_all\(3\) then B\(3\)"):
        CheckpointedSequential(model, M.schedule(loss_twice, M.chain(2)))


def test_a_schedule_recomputing_a_stage_before_the_loss_is_refused() -> None:
    ops = [Op(M.CK, 1), Op(M.CK, 2), Op(M.CK, 2), Op(M.A, 3), Op(M.A, 4), Op(M.B, 4), Op(M.B, 3), Op(M.A, 2),
           Op(M.B, 2), Op(M.A, 1), Op(M.B, 1)]
    schedule = M.schedule(ops, M.chain(3))
    simulate(schedule.chain, schedule)  # valid for the simulator
    with pytest.raises(InvalidScheduleError, match="the executor cannot run this schedule: before the loss"):
        apply_schedule(M.mlp(width=3, depth=2)[:3], schedule)
    with pytest.raises(InvalidScheduleError, match="the executor cannot run this schedule"):
        validate_ops(ops, 3)


def test_apply_schedule_works_in_place_with_qualified_relative_and_positional_names() -> None:
    model, container, _, _, _ = cnn_case()
    features = model.features
    schedule = M.schedule(M.store_all(len(container)), chain_for(container, "features."))
    assert apply_schedule(model, schedule) is model
    assert model.features is features and type(features) is nn.Sequential
    assert "forward" in features[0].__dict__ and "forward" in features[-1].__dict__
    assert "forward" not in model.head[0].__dict__
    root = M.mlp(depth=2)
    relative = M.schedule(M.store_all(4), chain_for(root))
    assert apply_schedule(root, relative) is root and type(root) is nn.Sequential
    nested = nn.Module()
    nested.body = M.mlp(depth=2)
    body = nested.body
    assert apply_schedule(nested, relative, container="body") is nested and nested.body is body
    assert all("forward" in child.__dict__ for child in body)
    unnamed = nn.Module()
    unnamed.body = M.mlp(depth=2)
    apply_schedule(unnamed, M.schedule(M.store_all(4), M.chain(4)), container="body")
    assert all("forward" in child.__dict__ for child in unnamed.body)


def test_apply_schedule_refuses_wrong_containers() -> None:
    model, container, _, _, _ = cnn_case()
    schedule = M.schedule(M.store_all(len(container)), chain_for(container, "features."))
    with pytest.raises(ScheduleMismatchError, match="the model has no module 'features.0'"):
        apply_schedule(model.head, schedule)
    with pytest.raises(ScheduleMismatchError, match="no submodule 'missing'"):
        apply_schedule(model, M.schedule(M.store_all(2), M.chain(2)), container="missing")
    with pytest.raises(ScheduleMismatchError, match="the model, which must be an nn.Sequential; found a CNN"):
        apply_schedule(model, M.schedule(M.store_all(2), M.chain(2)))
    with pytest.raises(ScheduleMismatchError, match="2 stages but head has 3 children"):
        apply_schedule(model, M.schedule(M.store_all(2), M.chain(2)), container="head")


def test_a_sequential_subclass_is_scheduled_in_place() -> None:
    class Net(nn.Sequential):
        pass

    torch.manual_seed(0)
    model = Net(nn.Linear(2, 2), nn.ReLU())
    x = torch.randn(3, 2)
    reference = run_step(model, x, lambda out: out.sum())
    scheduled = copy.deepcopy(model)
    assert apply_schedule(scheduled, M.schedule(M.revolve(2), M.chain(2))) is scheduled
    assert type(scheduled) is Net
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.sum()))


def test_applying_twice_replaces_the_previous_schedule() -> None:
    model = M.mlp(width=3, depth=2)
    x = torch.randn(2, 3)
    reference = run_step(model, x, lambda out: out.sum())
    scheduled = copy.deepcopy(model)
    apply_schedule(scheduled, M.schedule(M.revolve(4), M.chain(4)))
    first = scheduled[0].__dict__["forward"]
    apply_schedule(scheduled, M.schedule(M.store_all(4), M.chain(4)))
    assert scheduled[0].__dict__["forward"] is not first
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.sum()))

