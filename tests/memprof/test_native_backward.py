"""Backward marks from the native reporter equal those of the Python node pre-hooks (their reference)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint

from memprof import MemoryProfiler, zoo
from memprof.analysis.backward_replay import (
    NODE_GRAD,
    NODE_RUN,
    TASK_END,
    BackwardState,
    merge_marks,
    replay_backward,
    resolve_backward,
    resolve_backward_reference,
)
from memprof.capture.hooks import HookRecorder, Mark, module_tree
from memprof.capture.native.build import NativeBuildError
from memprof.capture.native.stream import NativeAllocationStream
from planner.executor import apply_schedule
from tests.planner import models as M


def _native_stream(device: str = "cpu") -> NativeAllocationStream:
    try:
        return NativeAllocationStream(torch.device(device))
    except NativeBuildError as exc:
        pytest.skip(f"native reporter unavailable: {exc}")


def _recorders(model: nn.Module, optimizer: torch.optim.Optimizer | None, device: str = "cpu"):
    """A Python-hook recorder and a native one on the same model, with the reporter running."""
    _, modules = module_tree(model)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters(recurse=False)))
    python, native = HookRecorder(modules, params, optimizer), HookRecorder(modules, params, optimizer)
    stream = _native_stream(device)
    stream.start()
    native.use_native_backward(stream.node_rows, stream.watch_backward())
    python.attach()
    native.attach()
    return python, native, stream


def _shape(marks: list) -> list[tuple[int, int, list]]:
    return [(int(kind), index, sorted(set(map(tuple, found)))) for _, kind, index, found in marks]


def _replayed(native: HookRecorder, state: BackwardState) -> tuple[list, BackwardState]:
    """The native recorder's marks of one iteration with its backward marks replayed, as the analysis does."""
    drained = native.drain()
    found, state = replay_backward(drained.node_rows, drained.watches, drained.candidates, native.thread_id, state)
    return merge_marks(drained.marks, found), state


def _same_marks(model: nn.Module, step, optimizer=None, steps: int = 2, device: str = "cpu") -> list:
    python, native, stream = _recorders(model, optimizer, device)
    state = BackwardState()
    try:
        for _ in range(steps):
            step()
            stream.collect()
            (got, state), expected = _replayed(native, state), python.drain().marks
            assert _shape(got) == _shape(expected)
            times = [m[0] for m in got]
            assert times == sorted(times)
    finally:
        python.detach()
        native.detach()
        stream.close()
    return expected


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_native_marks_equal_python_marks_on_example_models(name: str) -> None:
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    marks = _same_marks(model, lambda: zoo.train_step(model, optimizer, batch), optimizer)
    kinds = [int(m[1]) for m in marks]
    assert kinds.count(Mark.BWD_END) == 1
    assert kinds.count(Mark.BWD_ENTER) > 0 and kinds.count(Mark.BWD_EXIT) > 0
    # the gradients that flow through backward are in the marks, not only their times
    assert any(m[3] for m in marks if m[1] == Mark.BWD_ENTER)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_native_marks_equal_python_marks_on_cuda(name: str) -> None:
    # On CUDA, backward runs the nodes on the device's autograd thread: the reporter's callback
    # must follow it there (PyTorch carries the thread-local callbacks and the profiler slot).
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = tuple(t.cuda() for t in make_batch(4))
    marks = _same_marks(model, lambda: zoo.train_step(model, optimizer, batch), optimizer, device="cuda")
    kinds = [int(m[1]) for m in marks]
    assert kinds.count(Mark.BWD_END) == 1 and kinds.count(Mark.BWD_ENTER) > 0


def test_leaf_inputs_and_tuple_outputs_mix_python_and_native_marks() -> None:
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
    x = torch.randn(5, 6, requires_grad=True)  # a leaf: its marks come from a Python tensor hook

    def step() -> None:
        model(x).sum().backward()

    marks = _same_marks(model, step)
    assert any(m[1] == Mark.BWD_EXIT and m[2] == 0 for m in marks)  # the root's exit, through the leaf


def test_views_with_an_offset_are_marked_by_their_storage() -> None:
    # One tensor in, one out: the hooks' fast path, which must give the storage's address, not the view's.
    class Tail(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[2:]

    model = nn.Sequential(nn.Linear(4, 4), Tail(), nn.Linear(4, 1))
    seen: list[int] = []
    model[1].register_forward_hook(lambda m, a, out: seen.append(out.untyped_storage().data_ptr()))

    def step() -> None:
        model(torch.randn(6, 4)).sum().backward()

    marks = _same_marks(model, step)
    exits = [found for _, kind, index, found in marks if kind == Mark.FWD_EXIT and index == 2]
    assert [found[0][0] for found in exits] == seen[-1:] and exits[0][0][1] == 4 * 4 * 4


@pytest.mark.parametrize("schedule_name", ["revolve", "periodic"])
def test_native_marks_equal_python_marks_under_a_checkpointing_schedule(schedule_name: str) -> None:
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

    marks = _same_marks(scheduled, step)
    assert sum(1 for m in marks if m[1] == Mark.BWD_END) >= 1


@pytest.mark.parametrize("reentrant", [False, True])
def test_native_marks_equal_python_marks_with_torch_checkpoint(reentrant: bool) -> None:
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

    marks = _same_marks(model, step)
    recomputed = [m for m in marks if m[1] == Mark.FWD_ENTER and m[2] == 4]  # self.b (module order: '', a, a.0, a.1, b)
    assert len(recomputed) == 2  # the forward and its rerun in backward


def test_forward_without_backward_leaves_no_marks_and_is_forgotten() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    python, native, stream = _recorders(model, None)
    state = BackwardState()
    try:
        for _ in range(3):
            model(torch.randn(2, 4))  # grad enabled, no backward: an evaluation written carelessly
            stream.collect()
            got, state = _replayed(native, state)
            assert _shape(got) == _shape(python.drain().marks)
            assert len({w[0] for w in state.watches}) <= 3  # only the last forward's three nodes are carried
    finally:
        python.detach()
        native.detach()
        stream.close()


def test_closing_the_profiler_removes_the_backward_node_callback(tmp_path) -> None:
    lib = _native_stream()._lib
    model, make_batch = zoo.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = lib.memprof_thread_callbacks()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        assert lib.memprof_thread_callbacks() == 1
        zoo.train_step(model, optimizer, make_batch(4))
        profiler.record_stats()
    assert lib.memprof_thread_callbacks() == before == 0


# ------------------------------------------------------------------------------- the replay itself
def _rows_strategy():
    """Node rows as the reporter writes them, with watched marks and Python candidates."""
    run = st.tuples(st.integers(0, 5), st.integers(0, 2), st.sampled_from([7, 8]),
                    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 50)), max_size=2))
    return st.lists(st.one_of(run, st.integers(0, 2)), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(_rows_strategy(), st.lists(st.tuples(st.integers(0, 5), st.sampled_from([2, 3]), st.integers(0, 3),
                                            st.integers(0, 2)), max_size=12),
       st.lists(st.tuples(st.integers(0, 3), st.sampled_from([2, 3]), st.integers(0, 3), st.integers(0, 2)),
                max_size=4))
def test_resolve_backward_matches_its_event_by_event_reference(script, watches, leaf_marks) -> None:
    rows, time_ns = [], 0
    for item in script:
        time_ns += 10
        if isinstance(item, int):
            rows.append([TASK_END, time_ns, item, 0, 0])
            continue
        seq, task, thread, grads = item
        rows.append([NODE_RUN, time_ns, seq, task, thread])
        rows.extend([NODE_GRAD, k, 1000 + ptr, ptr, 0] for k, ptr in grads)

    watched: dict[int, list] = {}
    for seq, kind, call, output_nr in watches:  # the token is the module call's number
        watched.setdefault(seq, []).append((kind, call, call, output_nr))
    candidates = sorted(((t * 10 + 5, kind, call, call, [(t, 1)], task) for t, kind, call, task in leaf_marks),
                        key=lambda c: c[0])

    expected = resolve_backward_reference(rows, watched, candidates, 7)
    got = resolve_backward(rows, watched, candidates, 7)
    assert got == expected
    times = [m[0] for m in got]
    assert times == sorted(times)
    flat = [(seq, *pending) for seq, entries in watched.items() for pending in entries]
    assert replay_backward(np.array(rows, dtype=np.int64), flat, candidates, 7, BackwardState())[0] == expected


def test_replay_carries_undecided_watches_one_iteration_and_drops_decided_ones() -> None:
    enter, exit_ = int(Mark.BWD_ENTER), int(Mark.BWD_EXIT)
    # iteration 0: a forward watched nodes 1 (call 0) and 2 (call 1); only node 1 ran
    marks, state = replay_backward([[NODE_RUN, 10, 1, 4, 7]], [(1, enter, 0, 0, 0), (2, exit_, 1, 1, 0)], [], 7,
                                   BackwardState())
    assert [m[2] for m in marks] == [0]  # task 4 never ended: the backward raised
    assert state == BackwardState(((2, exit_, 1, 1, 0),))  # call 1 is still owed its mark
    # iteration 1: node 2 runs late in task 5, which then ends; this iteration watched nothing
    marks, state = replay_backward([[NODE_RUN, 20, 2, 5, 7], [TASK_END, 30, 5, 0, 0]], [], [], 7, state)
    assert [(m[1], m[2]) for m in marks] == [(exit_, 1), (Mark.BWD_END, -1)]
    assert state == BackwardState(())
    # iteration 2: a node iteration 0 watched runs again: two iterations on, it is forgotten
    assert replay_backward([[NODE_RUN, 40, 1, 6, 7]], [], [], 7, state)[0] == []


def test_late_backward_after_record_stats_gives_the_python_marks() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    python, native, stream = _recorders(model, None)
    state = BackwardState()
    try:
        loss = model(torch.randn(2, 4)).sum()
        stream.collect()
        got, state = _replayed(native, state)  # the iteration ends between forward and backward
        assert _shape(got) == _shape(python.drain().marks)
        loss.backward()
        stream.collect()
        got, state = _replayed(native, state)
        expected = python.drain().marks
        assert _shape(got) == _shape(expected) and any(m[1] == Mark.BWD_END for m in expected)
    finally:
        python.detach()
        native.detach()
        stream.close()
