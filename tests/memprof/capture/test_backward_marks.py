"""The backward marks: one BWD_ENTER and one BWD_EXIT per module call, from autograd-node pre-hooks.

A module call's backward begins when the gradient w.r.t. its output is ready (just before the node
that made the output runs) and ends when the gradient w.r.t. its input is: so a call whose output
requires grad gets exactly one BWD_ENTER, a call whose input requires grad exactly one BWD_EXIT,
and one BWD_END closes each backward.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from unittest import mock

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from examples import zoo
from memprof.analysis.records import Mark
from memprof.capture.hooks import HookRecorder
from memprof.capture.tensor_walk import module_tree, tensors
from planner.executor import apply_schedule
from tests.memprof.helpers import profile_steps
from tests.planner import models as M


def _recorder(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> HookRecorder:
    _, modules = module_tree(model)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters(recurse=False)))
    recorder = HookRecorder(modules, params, optimizer)
    recorder.attach()
    return recorder


class _GradFlow:
    """Counts, per module, the forward calls whose input and whose output require grad (the rule's expectation)."""

    def __init__(self, model: nn.Module) -> None:
        _, modules = module_tree(model)
        self.inputs: Counter[int] = Counter()
        self.outputs: Counter[int] = Counter()
        self.handles = [module.register_forward_hook(self._hook(index)) for index, module in enumerate(modules)]

    def _hook(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            if torch.is_grad_enabled():
                self.inputs[index] += any(t.requires_grad for t in tensors(args))
                self.outputs[index] += any(t.requires_grad for t in tensors(output))
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _marks_of_last_step(model: nn.Module, step: Callable[[], object], optimizer=None, steps: int = 2,
                        flow: bool = False) -> tuple[list, _GradFlow | None]:
    """The marks of the last of ``steps`` steps (and, with ``flow``, the grad flow of that step)."""
    recorder = _recorder(model, optimizer)
    try:
        for _ in range(steps):
            watcher = _GradFlow(model) if flow else None
            try:
                step()
            finally:
                if watcher is not None:
                    watcher.remove()
            marks = recorder.drain().marks
    finally:
        recorder.detach()
    return marks, watcher


def _check_rule(marks: list, flow: _GradFlow) -> None:
    counts = Counter((int(kind), index) for _, kind, index, _ in marks)
    modules = set(flow.inputs) | set(flow.outputs)
    for index in modules:
        assert counts[(Mark.BWD_ENTER, index)] == flow.outputs[index], index
        assert counts[(Mark.BWD_EXIT, index)] == flow.inputs[index], index
    assert counts[(Mark.BWD_END, -1)] == 1
    # (a module whose output is its input's own node, such as an identity, has both marks on that node, its
    # exit first: the order of enter and exit is not part of the rule)
    assert max(at for at, m in enumerate(marks) if m[1] in (Mark.BWD_ENTER, Mark.BWD_EXIT)) < \
        next(at for at, m in enumerate(marks) if m[1] == Mark.BWD_END)


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_every_module_call_is_marked_once_each_way_on_example_models(name: str) -> None:
    # the cnn's ReLUs are in place: their input and output are one tensor whose node changes
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    marks, flow = _marks_of_last_step(model, lambda: zoo.train_step(model, optimizer, batch), optimizer, flow=True)
    _check_rule(marks, flow)
    # the gradients that flow through backward are in the marks, not only their times
    assert all(m[3] for m in marks if m[1] == Mark.BWD_ENTER)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_every_module_call_is_marked_once_each_way_on_cuda(name: str) -> None:
    # On CUDA, backward runs the nodes on the device's autograd thread, where the pre-hooks run too.
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = tuple(t.cuda() for t in make_batch(4))
    marks, flow = _marks_of_last_step(model, lambda: zoo.train_step(model, optimizer, batch), optimizer, flow=True)
    _check_rule(marks, flow)


def test_a_chain_is_marked_in_reverse_forward_order() -> None:
    torch.manual_seed(0)
    model, make_batch = zoo.mlp()
    batch = make_batch(4)
    marks, _ = _marks_of_last_step(model, lambda: nn.functional.cross_entropy(model(batch[0]), batch[1]).backward())
    children = set(range(1, len(model) + 1))  # the root Sequential's children, in module order
    forward = [index for _, kind, index, _ in marks if kind == Mark.FWD_ENTER and index in children]
    backward = [index for _, kind, index, _ in marks if kind == Mark.BWD_ENTER and index in children]
    assert forward == sorted(children) and backward == forward[::-1]


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
    marks, flow = _marks_of_last_step(model, lambda: model(x).sum().backward(), flow=True)
    _check_rule(marks, flow)  # two outputs, one call: one BWD_ENTER
    assert any(m[1] == Mark.BWD_EXIT and m[2] == 0 for m in marks)  # the root's exit, through the leaf


def test_the_one_tensor_fast_path_gives_the_generic_marks() -> None:
    torch.manual_seed(0)
    model, make_batch = zoo.cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = make_batch(4)
    fast, generic = _recorder(model, optimizer), _recorder(model, optimizer)
    try:
        with mock.patch.object(generic, "_plain_tensor", lambda *args: False):
            for _ in range(2):
                zoo.train_step(model, optimizer, batch)
                got, expected = fast.drain().marks, generic.drain().marks
                assert [(int(k), i, sorted(s)) for _, k, i, s in got] == \
                    [(int(k), i, sorted(s)) for _, k, i, s in expected]
    finally:
        fast.detach()
        generic.detach()


def test_views_with_an_offset_are_marked_by_their_storage() -> None:
    # One tensor in, one out: the hooks' fast path, which must give the storage's address, not the view's.
    class Tail(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[2:]

    model = nn.Sequential(nn.Linear(4, 4), Tail(), nn.Linear(4, 1))
    seen: list[int] = []
    model[1].register_forward_hook(lambda m, a, out: seen.append(out.untyped_storage().data_ptr()))
    marks, _ = _marks_of_last_step(model, lambda: model(torch.randn(6, 4)).sum().backward())
    exits = [found for _, kind, index, found in marks if kind == Mark.FWD_EXIT and index == 2]
    assert [found[0][0] for found in exits] == seen[-1:] and exits[0][0][1] == 4 * 4 * 4


@pytest.mark.parametrize("schedule_name", ["revolve", "periodic"])
def test_a_checkpointing_schedule_keeps_the_rule(schedule_name: str) -> None:
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

    marks, flow = _marks_of_last_step(scheduled, step, flow=True)
    _check_rule(marks, flow)


@pytest.mark.parametrize("reentrant", [False, True])
def test_torch_checkpoint_reruns_the_forward_and_marks_each_backward_once(reentrant: bool) -> None:
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

    marks, _ = _marks_of_last_step(model, step)
    counts = Counter((int(kind), index) for _, kind, index, _ in marks)
    assert counts[(Mark.FWD_ENTER, 4)] == 2  # self.b (module order: '', a, a.0, a.1, b): the forward and its rerun
    assert all(counts[(Mark.BWD_ENTER, index)] == 1 for index in range(8)) and counts[(Mark.BWD_END, -1)] == 1


def test_forward_without_backward_leaves_no_backward_marks() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    recorder = _recorder(model)
    try:
        for _ in range(3):
            model(torch.randn(2, 4))  # grad enabled, no backward: an evaluation written carelessly
            kinds = {m[1] for m in recorder.drain().marks}
            assert kinds == {Mark.FWD_ENTER, Mark.FWD_EXIT}
    finally:
        recorder.detach()


def test_a_backward_after_the_iteration_ended_is_marked_in_the_next() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    recorder = _recorder(model)
    try:
        loss = model(torch.randn(2, 4)).sum()
        assert not any(m[1] == Mark.BWD_ENTER for m in recorder.drain().marks)  # the iteration ends here
        loss.backward()
        kinds = Counter(int(m[1]) for m in recorder.drain().marks)
        assert kinds[Mark.BWD_ENTER] == 4 and kinds[Mark.BWD_EXIT] == 2 and kinds[Mark.BWD_END] == 1
    finally:
        recorder.detach()


def test_the_layers_table_has_backward_times(tmp_path) -> None:
    torch.manual_seed(0)
    model, make_batch = zoo.mlp()
    layers = profile_steps(model, make_batch, tmp_path, steps=2).layers
    assert len(layers) == 2 * (len(model) + 1)
    assert (layers.backward_ms > 0).all() and (layers.forward_ms > 0).all()
