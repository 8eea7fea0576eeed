"""The backward marks: when each module's backward begins and ends, from one autograd-node pre-hook each.

A module's backward begins when the gradient of its output is ready (just before the node that made the
output runs) and ends when the gradient of its input is ready. These tests check the marks' shape on
example models, under checkpointing and recomputation, and that they hold no tensor.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memprof import zoo
from memprof.analysis.records import Mark
from memprof.capture.hooks import HookRecorder
from memprof.capture.tensor_walk import module_tree
from planner.executor import apply_schedule
from tests.planner import models as M


def _recorder(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> HookRecorder:
    _, modules = module_tree(model)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters(recurse=False)))
    recorder = HookRecorder(modules, params, optimizer)
    recorder.attach()
    return recorder


def _marks(model: nn.Module, step, optimizer=None, steps: int = 2) -> list:
    """The marks of the last of ``steps`` steps, checked to be in time order."""
    recorder = _recorder(model, optimizer)
    try:
        for _ in range(steps):
            step()
            marks = recorder.drain().marks
            times = [m[0] for m in marks]
            assert times == sorted(times)
    finally:
        recorder.detach()
    return marks


def _kinds(marks: list, kind: Mark) -> list[int]:
    return [index for _, k, index, _ in marks if k == kind]


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_every_module_call_gets_one_backward_enter_after_its_forward(name: str) -> None:
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    marks = _marks(model, lambda: zoo.train_step(model, optimizer, batch), optimizer)
    assert _kinds(marks, Mark.BWD_END) == [-1]
    enters = Counter(_kinds(marks, Mark.BWD_ENTER))
    assert enters and max(enters.values()) <= Counter(_kinds(marks, Mark.FWD_ENTER))[max(enters, key=enters.get)]
    assert set(enters) <= set(_kinds(marks, Mark.FWD_EXIT))
    position = {(k, i): n for n, (_, k, i, _) in enumerate(marks)}
    for module in enters:  # a module's backward begins after its forward ended
        assert position[(Mark.BWD_ENTER, module)] > position[(Mark.FWD_EXIT, module)]
    # the gradients that flow through backward are in the marks, not only their times
    assert any(found for _, kind, _, found in marks if kind == Mark.BWD_ENTER)


def test_a_chain_runs_backward_in_reverse_order() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(3, 4)
    marks = _marks(model, lambda: model(x).sum().backward())
    children = list(range(1, 6))  # module order: the Sequential (0), then its children
    assert [i for i in _kinds(marks, Mark.FWD_ENTER) if i] == children
    assert [i for i in _kinds(marks, Mark.BWD_ENTER) if i] == children[::-1]
    # the first layer's input (the batch) needs no gradient: its backward has no end of its own
    assert [i for i in _kinds(marks, Mark.BWD_EXIT) if i] == children[:0:-1]


def test_leaf_inputs_and_tuple_outputs() -> None:
    class Split(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x[:, :3] * 2, x[:, 3:].relu()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.split, self.head = nn.Linear(6, 6), Split(), nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = self.split(self.lin(x))
            return self.head(a + b)

    model = Net()
    x = torch.randn(5, 6, requires_grad=True)  # a leaf: its marks come from a tensor hook
    marks = _marks(model, lambda: model(x).sum().backward())
    assert 0 in _kinds(marks, Mark.BWD_EXIT)  # the root's exit, through the leaf
    assert _kinds(marks, Mark.BWD_ENTER).count(2) == 1  # two outputs, one mark: the first gradient ready


def test_views_with_an_offset_are_marked_by_their_storage() -> None:
    # One tensor in, one out: the hooks' fast path, which must give the storage's address, not the view's.
    class Tail(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[2:]

    model = nn.Sequential(nn.Linear(4, 4), Tail(), nn.Linear(4, 1))
    seen: list[int] = []
    model[1].register_forward_hook(lambda m, a, out: seen.append(out.untyped_storage().data_ptr()))
    marks = _marks(model, lambda: model(torch.randn(6, 4)).sum().backward())
    exits = [found for _, kind, index, found in marks if kind == Mark.FWD_EXIT and index == 2]
    assert [found[0][0] for found in exits] == seen[-1:] and exits[0][0][1] == 4 * 4 * 4


@pytest.mark.parametrize("schedule_name", ["revolve", "periodic"])
def test_marks_under_a_checkpointing_schedule(schedule_name: str) -> None:
    # The executor runs nested backward graph tasks and recomputes forwards inside backward.
    model = M.mlp(width=6, depth=4)
    length = len(model)
    schedule_fn = M.revolve if schedule_name == "revolve" else (lambda n: M.periodic(n, 2))
    names = [[name] for name, _ in model.named_children()]
    scheduled = apply_schedule(copy.deepcopy(model), M.schedule(schedule_fn(length), M.chain(length, names)))
    x = torch.randn(4, 6)

    def step() -> None:
        scheduled.zero_grad(set_to_none=True)
        scheduled(x).pow(2).sum().backward()

    marks = _marks(scheduled, step)
    assert len(_kinds(marks, Mark.BWD_END)) >= 1
    assert set(_kinds(marks, Mark.BWD_ENTER)) >= set(range(1, length + 1))  # every stage's backward is seen


@pytest.mark.parametrize("reentrant", [False, True])
def test_marks_with_torch_checkpoint(reentrant: bool) -> None:
    # torch.utils.checkpoint reruns the forward (and its hooks) inside backward.
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
            self.b = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
            self.c = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(checkpoint(self.b, self.a(x), use_reentrant=reentrant))

    model = Net()
    x = torch.randn(4, 6)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    marks = _marks(model, step)
    assert _kinds(marks, Mark.FWD_ENTER).count(4) == 2  # self.b (order: '', a, a.0, a.1, b): forward and rerun
    assert 4 in _kinds(marks, Mark.BWD_ENTER) and 7 in _kinds(marks, Mark.BWD_ENTER)  # b and c


def test_forward_without_backward_leaves_no_backward_marks() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    recorder = _recorder(model)
    try:
        for _ in range(3):
            model(torch.randn(2, 4))  # grad enabled, no backward: an evaluation written carelessly
            marks = recorder.drain().marks
            assert _kinds(marks, Mark.FWD_ENTER) == [0, 1, 2, 3]
            assert not _kinds(marks, Mark.BWD_ENTER) and not _kinds(marks, Mark.BWD_END)
    finally:
        recorder.detach()


def test_a_backward_after_the_iteration_ended_is_marked_in_the_next() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    recorder = _recorder(model)
    try:
        loss = model(torch.randn(2, 4)).sum()
        assert not _kinds(recorder.drain().marks, Mark.BWD_ENTER)  # the iteration ends between forward and backward
        loss.backward()
        marks = recorder.drain().marks
        # the Sequential (0) and its last child (3) share their output: one node, both marks, in call order
        assert _kinds(marks, Mark.BWD_ENTER) == [3, 0, 2, 1] and _kinds(marks, Mark.BWD_END) == [-1]
    finally:
        recorder.detach()


def test_the_pre_hooks_hold_no_tensor() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    recorder = _recorder(model)
    try:
        x = torch.randn(2, 4)
        out = model(x)
        ref = __import__("weakref").ref(out)
        del out
        assert ref() is None  # the hooks keep node metadata, never the activation itself
    finally:
        recorder.detach()
