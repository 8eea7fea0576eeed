"""No leaks, no interference: the profiler holds no tensor, leaves no hook, survives a failing model.

Memory is measured two ways: by the allocator's own events (the trace's ``allocated_bytes``, which
comes from torch.profiler's memory events) and by a census of every tensor the garbage collector can
reach. Tensors created by a step are watched with weak references.
"""

from __future__ import annotations

import gc
import shutil
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.autograd import _profiler_enabled

from examples import zoo
from memprof import MemoryProfiler, ProfilerError, load_trace
from tests.memprof.helpers import TINY_MLP_WEIGHT_BYTES, assert_exact_model_bytes

STEPS = 100
ATTACH_CYCLES = 1000


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _live_storages() -> dict[int, int]:
    """The unique storages (address -> bytes) of every tensor the garbage collector can reach."""
    gc.collect()
    found: dict[int, int] = {}
    for obj in gc.get_objects():
        # type() rather than isinstance(): some torch objects warn when their __class__ is read.
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
            try:
                storage = obj.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
            except RuntimeError:  # a fake tensor that an earlier torch.compile left in dynamo's caches: no memory
                continue
    found.pop(0, None)  # empty storages
    return found


def _new_bytes(before: dict[int, int]) -> int:
    """Bytes of storages alive now that were not alive in ``before`` (tensors other tests leave to
    the garbage collector may die meanwhile; they must not count)."""
    return sum(n for ptr, n in _live_storages().items() if before.get(ptr) != n)


def _watched_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[weakref.ref]:
    """One training step; returns weak references to every tensor it created that should die with it."""
    refs: list[weakref.ref] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        refs.append(weakref.ref(tensor))  # what autograd saves for backward (activations, weight views)
        return tensor

    inputs, targets = torch.randn(4, 8), torch.randint(0, 4, (4,))
    optimizer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(inputs)
        loss = nn.functional.cross_entropy(output, targets)
    loss.backward()
    optimizer.step()
    return refs + [weakref.ref(t) for t in (inputs, targets, output, loss)]


def _hundred_steps(model, optimizer, profiler: MemoryProfiler | None) -> None:
    for step in range(STEPS):
        refs = _watched_step(model, optimizer)
        if profiler is not None:
            profiler.record_stats()
        # Freed when the step returns, by reference counting alone: nothing else holds them.
        alive = [r() for r in refs if r() is not None]
        assert not alive, f"step {step}: {len(alive)} tensors of the step are still alive"


def _state_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the parameters, bytes Adam keeps: two moments per parameter and a float32 step)."""
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    return weights, 2 * weights + 4 * len(params)


def test_hundred_profiled_iterations_leave_the_same_memory_as_plain_ones(tmp_path):
    model, optimizer = _tiny()
    before = _live_storages()
    _hundred_steps(model, optimizer, None)
    plain = _new_bytes(before)

    model, optimizer = _tiny()
    before = _live_storages()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        _hundred_steps(model, optimizer, profiler)
    profiled = _new_bytes(before)

    weights, adam = _state_bytes(model)
    # What survives training is the weight gradients and Adam's state, with or without the profiler.
    assert plain == profiled == weights + adam
    # The allocator agrees, iteration after iteration: weights + gradients + Adam, nothing accumulating.
    iterations = load_trace(profiler.run_dir).iterations
    assert len(iterations) == STEPS
    np.testing.assert_array_equal(iterations.allocated_bytes.to_numpy(), np.full(STEPS, 2 * weights + adam))
    assert iterations.peak_allocated_bytes.nunique() == 1


def _hook_count(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    count = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                + len(m._backward_pre_hooks) for m in model.modules())
    count += sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) + len(p._backward_hooks or {})
                 for p in model.parameters())
    return count + len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)


def _attach_and_close(model, optimizer, out_dir, cycles: int, first: int) -> None:
    for i in range(first, first + cycles):
        profiler = MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=f"r{i}", print_period=0)
        assert _hook_count(model, optimizer) > 0
        if i % 100 == 0:  # now and then a real iteration, so that frees are watched and drained
            zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
            profiler.record_stats()
        profiler.close()
        assert _hook_count(model, optimizer) == 0
        assert not _profiler_enabled()
    shutil.rmtree(out_dir)  # keep the temporary folder small


@pytest.mark.slow
def test_attaching_and_closing_a_thousand_times_leaves_no_hook_and_no_growth(tmp_path,
                                                                             record_testsuite_property):
    model, optimizer = _tiny()
    zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))
    _attach_and_close(model, optimizer, tmp_path / "warm", 100, 0)  # warm caches (imports, interning)
    gc.collect()
    objects, finalizers, tensors = len(gc.get_objects()), len(weakref.finalize._registry), _live_storages()
    _attach_and_close(model, optimizer, tmp_path / "cycles", ATTACH_CYCLES, 100)
    gc.collect()
    growth = len(gc.get_objects()) - objects
    record_testsuite_property("object_growth_per_1000", growth)
    assert _hook_count(model, optimizer) == 0
    assert len(weakref.finalize._registry) == finalizers  # every watch on a storage was removed
    assert sum(_live_storages().values()) == sum(tensors.values())
    # A leak of one object per cycle would show 1,000; allow the interpreter's own caches some slack.
    assert growth < 300, f"{growth} more objects after {ATTACH_CYCLES} attach/close cycles"


class Flaky(nn.Module):
    """Passes its input through, or raises when told to: a model bug in the middle of the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("bad batch")
        return x


class FailingBackward(torch.autograd.Function):
    """Identity forward; its backward raises when ``armed``."""

    armed = False

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if FailingBackward.armed:
            raise RuntimeError("backward failed")
        return grad


class BackwardTrap(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return FailingBackward.apply(x)


def _flaky_model() -> tuple[nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Flaky(), BackwardTrap(), nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model, optimizer) -> None:
    zoo.train_step(model, optimizer, (torch.randn(4, 8), torch.randint(0, 4, (4,))))


LAYER_COSTS = ["module", "calls", "output_bytes", "saved_bytes", "feature_map_bytes", "grad_input_bytes"]


def _assert_like_first_iteration(trace, iteration: int, marks: bool = True) -> None:
    """The iteration's per-layer sizes (and, if ``marks``, its timeline marks) equal iteration 0's."""
    layers = trace.layers.set_index("iteration")
    first = layers.loc[0, LAYER_COSTS].reset_index(drop=True)
    later = layers.loc[iteration, LAYER_COSTS].reset_index(drop=True)
    assert first.equals(later), f"iteration {iteration} differs from iteration 0:\n{later}\nvs\n{first}"
    if marks:
        events = trace.events
        shape = [events[events.iteration == it][["phase", "module", "event"]].to_numpy().tolist()
                 for it in (0, iteration)]
        assert shape[1] == shape[0], f"iteration {iteration} has other marks than iteration 0"


def _assert_consistent(trace) -> None:
    # Failed iterations differ from the others, so only the model's exact bytes are compared, not the peaks.
    assert_exact_model_bytes(trace, TINY_MLP_WEIGHT_BYTES, steady=False)


@pytest.mark.parametrize("record_failed_iteration", [False, True])
def test_forward_that_raises_leaves_the_profiler_consistent(tmp_path, record_failed_iteration):
    model, optimizer = _flaky_model()
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
    _step(model, optimizer)
    profiler.record_stats()
    model[2].fail = True
    with pytest.raises(ValueError, match="bad batch"):
        _step(model, optimizer)
    model[2].fail = False
    if record_failed_iteration:
        profiler.record_stats()  # a loop that records every iteration, failed or not
    for _ in range(2):  # otherwise the failed step is part of the next recorded iteration
        _step(model, optimizer)
        profiler.record_stats()
    profiler.close()
    assert _hook_count(model, optimizer) == 0 and not _profiler_enabled()
    trace = load_trace(profiler.run_dir)
    last = 3 if record_failed_iteration else 2
    assert trace.iterations.iteration.tolist() == list(range(last + 1))
    _assert_consistent(trace)
    _assert_like_first_iteration(trace, last)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert trace.iterations.allocated_bytes.iloc[-1] == 2 * weights  # weights and their gradients
    if record_failed_iteration:  # the failed iteration: nothing after the failing module ran
        failed = trace.layers[trace.layers.iteration == 1].set_index("module")
        assert failed.loc["0", "calls"] == 1 and failed.loc["4", "calls"] == 0


def _run_with_failing_backward(tmp_path):
    model, optimizer = _flaky_model()
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
    try:
        _step(model, optimizer)
        profiler.record_stats()
        FailingBackward.armed = True
        with pytest.raises(RuntimeError, match="backward failed"):
            _step(model, optimizer)
        FailingBackward.armed = False
        profiler.record_stats()
        for _ in range(2):
            _step(model, optimizer)
            profiler.record_stats()
    finally:
        FailingBackward.armed = False
        profiler.close()
    assert _hook_count(model, optimizer) == 0 and not _profiler_enabled()
    return load_trace(profiler.run_dir)


def test_backward_that_raises_leaves_the_profiler_consistent(tmp_path):
    trace = _run_with_failing_backward(tmp_path)
    _assert_consistent(trace)
    _assert_like_first_iteration(trace, 3, marks=False)


def test_backward_end_is_recorded_again_after_a_failed_backward(tmp_path):
    trace = _run_with_failing_backward(tmp_path)
    _assert_like_first_iteration(trace, 3, marks=True)


def test_exception_in_a_with_block_closes_and_propagates(tmp_path):
    model, optimizer = _flaky_model()
    model[2].fail = True
    with pytest.raises(ValueError, match="bad batch"), MemoryProfiler(model, optimizer, out_dir=tmp_path,
                                                                       print_period=0) as profiler:
        _step(model, optimizer)
    assert _hook_count(model, optimizer) == 0 and not _profiler_enabled()
    assert load_trace(profiler.run_dir).meta["status"] == "closed"
    MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0).close()  # the model is free again


def _run_dirs(root) -> set:
    return {p.parent for p in root.rglob("meta.json")}


def test_second_or_nested_profiler_is_refused_and_the_first_is_not_corrupted(tmp_path):
    model, optimizer = _tiny()
    first = MemoryProfiler(model, optimizer, out_dir=tmp_path / "first", print_period=0)
    _step(model, optimizer)
    first.record_stats()
    hooks = _hook_count(model, optimizer)
    with pytest.raises(ProfilerError, match="already attached"):
        MemoryProfiler(model, optimizer, out_dir=tmp_path / "second", print_period=0)
    # A profiler on a submodule, or on another model, would need a second allocator session.
    with pytest.raises(ProfilerError):
        MemoryProfiler(model[0], out_dir=tmp_path / "nested", print_period=0)
    with pytest.raises(ProfilerError):
        MemoryProfiler(nn.Linear(2, 2), out_dir=tmp_path / "other", print_period=0)
    assert _hook_count(model, optimizer) == hooks  # the refusals added no hook
    _step(model, optimizer)
    first.record_stats()
    first.close()
    trace = load_trace(first.run_dir)
    _assert_consistent(trace)
    _assert_like_first_iteration(trace, 1)  # no mark recorded twice, no size changed


def test_refused_profiler_leaves_no_run_directory(tmp_path):
    model, optimizer = _tiny()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path / "first", print_period=0) as first:
        with pytest.raises(ProfilerError):
            MemoryProfiler(model[0], out_dir=tmp_path / "nested", run_id="nested", print_period=0)
        _step(model, optimizer)
        first.record_stats()
    assert _run_dirs(tmp_path) == {first.run_dir}


# ---------------------------------------------------------------------------------- torch.compile

def _compile_usable(backend: str) -> str | None:
    """Why ``torch.compile`` with ``backend`` cannot run here, or ``None`` when it can."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if backend == "inductor" and not (shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")):
        return "inductor needs a C++ compiler on CPU and none is installed"
    return None


def _profile_compiled(tmp_path, backend: str, compile_first: bool, fullgraph: bool = False):
    model, optimizer = _tiny()
    steps = 4  # compiled (and compiling), eager, eager, compiled
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if compile_first:
            compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
            profiler = MemoryProfiler(compiled, optimizer, out_dir=tmp_path, print_period=0)
        else:
            profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0)
            compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
        try:
            for _ in range(steps):
                _step(compiled, optimizer)
                profiler.record_stats()
        finally:
            profiler.close()
            torch._dynamo.reset()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
            and ("memprof" in str(w.message) or "eager" in str(w.message))]
    return load_trace(profiler.run_dir), said


def _assert_profiled_or_said_so(trace, said: list[str], compile_first: bool) -> None:
    """A compiled graph runs no module hooks, so the profiler runs iterations 1 and 2 eagerly: their layers are
    exact (Linear(8, 16)'s 4x16 float32 = 256 B output and Linear(16, 4)'s 64 B), the compiled iterations' are
    empty, never wrong, ``meta.json`` says which ran eagerly, a warning says what the compiled iterations show,
    and the totals come from the allocator: the weights to the byte, every step alike.

    Handed the compiled model, the profiler hooks its wrapper, outside the graph: the compiled iteration keeps
    its phases (feature maps apart from ``other``). Compiled after attaching, no hook runs in a compiled
    iteration: its activations read as ``other``, as the warning says.
    """
    assert trace.meta["compiled"] is True and trace.meta["eager_iterations"] == [1, 2]
    layers = trace.layers[trace.layers.kind == "Linear"]
    eager = layers[layers.iteration.isin([1, 2])].groupby("iteration").output_bytes.apply(sorted)
    assert [list(v) for v in eager] == [[64, 256], [64, 256]], eager
    compiled = layers[layers.iteration.isin([0, 3])]
    assert len(compiled) == 4 and (compiled.output_bytes == 0).all(), f"compiled per-layer rows:\n{compiled}"
    assert_exact_model_bytes(trace, TINY_MLP_WEIGHT_BYTES)
    assert (trace.iterations.peak_allocated_bytes > TINY_MLP_WEIGHT_BYTES).all()
    last = trace.read("events", iterations=[3])  # compiled, and compiling no more
    if compile_first:
        assert any("torch.compile'd" in s and "eagerly" in s for s in said), said
        assert last.feature_maps.max() > 0 and {"forward", "backward"} <= set(last.phase)
    else:
        assert any("no module hook fired" in s and "'other'" in s for s in said), said
        assert last.feature_maps.max() == 0 and last.other.max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("compile_first", [True, False], ids=["compiled-model", "compiled-after-attach"])
def test_compiled_model_gets_layers_from_its_eager_iterations(tmp_path, compile_first):
    reason = _compile_usable("aot_eager")
    if reason:
        pytest.skip(reason)
    trace, said = _profile_compiled(tmp_path, "aot_eager", compile_first)
    _assert_profiled_or_said_so(trace, said, compile_first)


@pytest.mark.slow
def test_inductor_compiled_model_gets_layers_from_its_eager_iterations(tmp_path):
    reason = _compile_usable("inductor")
    if reason:
        pytest.skip(reason)
    trace, said = _profile_compiled(tmp_path, "inductor", compile_first=True)
    _assert_profiled_or_said_so(trace, said, compile_first=True)


@pytest.mark.slow
def test_fullgraph_compile_is_not_broken_by_the_profiler(tmp_path):
    for compile_first in (True, False):
        trace, said = _profile_compiled(tmp_path / str(compile_first), "aot_eager", compile_first, fullgraph=True)
        _assert_profiled_or_said_so(trace, said, compile_first)
