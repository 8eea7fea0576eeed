"""The profiler on real models: exact bytes, allocator truth, live (not accumulated) memory."""

from __future__ import annotations

import gc
import io
import weakref

import pytest
import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, ProfilerError, load_trace
from memprof.estimation.cuda_allocator import round_size
from tests.memprof.helpers import CATEGORIES, forward_exit, profile_steps, without_collector


def _layer(trace, iteration: int, module: str):
    layers = trace.layers
    return layers[(layers.iteration == iteration) & (layers.module == module)].iloc[0]


def test_linear_weight_and_grad_bytes_are_exact(tmp_path):
    model = nn.Sequential(nn.Linear(100, 30), nn.ReLU(), nn.Linear(30, 7))
    trace = profile_steps(model, lambda n: (torch.randn(n, 100), torch.randint(0, 7, (n,))), tmp_path)
    first = _layer(trace, 2, "0")
    assert first.weight_bytes == (100 * 30 + 30) * 4
    assert first.weight_grad_bytes == (100 * 30 + 30) * 4
    assert _layer(trace, 2, "2").weight_bytes == (30 * 7 + 7) * 4
    assert _layer(trace, 2, "").weight_bytes == (100 * 30 + 30 + 30 * 7 + 7) * 4
    assert trace.iterations.weights.tolist() == [(100 * 30 + 30 + 30 * 7 + 7) * 4] * 3


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
def test_element_sizes_follow_dtype(tmp_path, dtype, size):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)).to(dtype)
    trace = profile_steps(model, lambda n: (torch.randn(n, 64, dtype=dtype), torch.randint(0, 4, (n,))), tmp_path)
    assert _layer(trace, 1, "0").weight_bytes == (64 * 32 + 32) * size
    assert _layer(trace, 1, "0").output_bytes == 8 * 32 * size


def _saved_activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Unique storage bytes autograd saves in a forward (parameters and the input excluded) plus the output."""
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    saved[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    return sum(saved.values())


def test_mlp_feature_maps_equal_what_autograd_saves(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=64, in_features=32)
    expected = _saved_activation_bytes(model, make_batch(16)[0])
    trace = profile_steps(model, make_batch, tmp_path, batch_size=16, steps=4)
    for iteration in range(4):
        assert forward_exit(trace, iteration).feature_maps == expected


def test_feature_maps_do_not_accumulate_across_iterations(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.cnn(channels=8, blocks=2, image=16)
    trace = profile_steps(model, make_batch, tmp_path, steps=5)
    values = [forward_exit(trace, i).feature_maps for i in range(5)]
    assert values[0] > 0 and len(set(values[1:])) == 1
    # between iterations nothing of the forward is alive any more
    ends = trace.events[(trace.events.event == "end") & (trace.events.phase == "other")]
    assert (ends.feature_maps == 0).all() and (ends.grads == 0).all()


def test_adam_state_is_twice_the_parameters_after_the_first_step(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=32, in_features=16)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params)
    trace = profile_steps(model, make_batch, tmp_path, optimizer=optimizer, steps=2)
    param_bytes = sum(p.numel() * 4 for p in params)
    step_counters = sum(s["step"].untyped_storage().nbytes() for s in optimizer.state.values())
    end = trace.events[(trace.events.event == "end") & (trace.events.phase == "other")]
    assert end.optimizer_state.tolist() == [2 * param_bytes + step_counters] * 2
    starts = trace.events[(trace.events.iteration == 0) & (trace.events.event == "start")]
    assert starts.optimizer_state.tolist() == [0]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_weight_grads_seen_with_either_zero_grad(tmp_path, set_to_none):
    model = nn.Sequential(nn.Linear(20, 10), nn.Tanh(), nn.Linear(10, 2))
    trace = profile_steps(model, lambda n: (torch.randn(n, 20), torch.randint(0, 2, (n,))), tmp_path,
                          set_to_none=set_to_none)
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert (trace.iterations.weight_grads == grad_bytes).all()
    assert (trace.layers[trace.layers.module == ""].weight_grad_bytes == grad_bytes).all()


def test_the_one_identity_allocated_is_the_sum_of_the_categories(tmp_path):
    """An identity, not a measurement: ``allocated_bytes`` is defined as the sum of the categories
    (``analysis/timeline.py``; on CUDA the gap to the allocator goes into ``other``), and the iterations
    table's peak is read from the same series as the events table's. Kept once, on one model, to guard a
    refactoring that computed them apart; whether the numbers are right is checked against the allocator in
    :func:`test_allocated_bytes_are_the_allocators` and category by category in ``test_category_oracles.py``."""
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=32, in_features=16)
    trace = profile_steps(model, make_batch, tmp_path, optimizer=torch.optim.Adam(model.parameters()))
    events, iterations = trace.events, trace.iterations
    assert (events[CATEGORIES].sum(axis=1) == events.allocated_bytes).all()
    assert (iterations[CATEGORIES].sum(axis=1) == iterations.peak_allocated_bytes).all()
    for _, row in iterations.iterrows():
        assert row.peak_allocated_bytes == events[events.iteration == row.iteration].peak_bytes.max()


def test_shared_weight_counts_once(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.transformer(layers=1)
    unique = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    all_params = sum(p.numel() * 4 for _, p in model.named_parameters(remove_duplicate=False))
    trace = profile_steps(model, make_batch, tmp_path, steps=1)
    assert sum(unique.values()) < all_params
    assert trace.iterations.weights.iloc[0] == sum(unique.values())
    assert _layer(trace, 0, "").weight_bytes == sum(unique.values())


def test_lstm_tuple_outputs_and_batchnorm_buffers(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.lstm()
    trace = profile_steps(model, make_batch, tmp_path)
    lstm_row = _layer(trace, 1, "lstm")
    assert lstm_row.output_bytes > 0 and lstm_row.backward_ms > 0
    cnn, cnn_batch = zoo.cnn(channels=8, blocks=1, image=8)
    buffer_bytes = sum(b.untyped_storage().nbytes() for b in cnn.buffers())
    trace = profile_steps(cnn, cnn_batch, tmp_path / "cnn")
    assert (trace.iterations.buffers == buffer_bytes).all()


def test_functional_ops_between_modules(tmp_path):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(12, 12), nn.Linear(12, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.tanh(torch.nn.functional.gelu(self.a(x))))

    torch.manual_seed(0)
    model = Net()
    make_batch = lambda n: (torch.randn(n, 12), torch.randint(0, 3, (n,)))  # noqa: E731
    # The functional ops' tensors are no module's output: gelu saves a's output, tanh its own (b's input).
    expected = _saved_activation_bytes(model, make_batch(8)[0])
    trace = profile_steps(model, make_batch, tmp_path)
    assert set(trace.layers.module) == {"", "a", "b"}
    assert [forward_exit(trace, i).feature_maps for i in range(3)] == [expected] * 3


def _memory_events(step) -> list[int]:
    """Allocation sizes (+) and frees (-) torch.profiler reports for one call of ``step``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    return [e.nbytes() for e in sorted(events, key=lambda e: e.start_ns())]


def _peak_of(sizes: list[int]) -> int:
    running, peak = 0, 0
    for size in sizes:
        running += size
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_allocated_bytes_are_the_allocators(tmp_path, name):
    """What is allocated when a steady step starts is the storages alive then (the test reads them from the
    tensors: parameters, their gradients, buffers, the model's input), and the peak rises above it by exactly
    what torch.profiler's raw allocator events rise in the same step: memprof's ``allocated_bytes`` against two
    measurements it does not make itself."""
    torch.manual_seed(0)
    model, make_batch = zoo.ZOO[name]()
    model.eval() if name == "cnn" else None  # no dropout: the same allocations every step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = make_batch(8)

    def step() -> None:
        zoo.train_step(model, optimizer, batch, set_to_none=False)

    step()  # gradients exist: the step allocates only transient memory
    with without_collector():
        expected = _peak_of(_memory_events(step))
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
            for _ in range(2):
                step()
                profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    start = trace.events[trace.events.event == "start"].allocated_bytes.to_numpy()
    measured = trace.iterations.peak_allocated_bytes.to_numpy() - start
    assert measured.tolist() == [expected, expected]
    # The targets were made before profiling and are no input of the model: on a CPU memprof cannot see them.
    alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for t in (*model.parameters(), *(p.grad for p in model.parameters()), *model.buffers(), batch[0])}
    assert start.tolist() == [sum(alive.values())] * 2


def _hook_counts(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    count = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    count += sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())
    return count + len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)


def test_close_removes_hooks_and_leaves_allocations_unchanged(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=32, in_features=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = make_batch(4)

    def step() -> None:
        zoo.train_step(model, optimizer, batch, set_to_none=False)

    step()
    before = _memory_events(step)
    assert _hook_counts(model, optimizer) == 0
    for _ in range(3):
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
            step()
            profiler.record_stats()
        assert _hook_counts(model, optimizer) == 0
    assert _memory_events(step) == before


def test_profiler_holds_no_tensor(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        x = torch.randn(4, 8)
        out = model(x)
        out.sum().backward()
        refs = [weakref.ref(x), weakref.ref(out)]
        del x, out
        gc.collect()
        assert all(r() is None for r in refs)
        profiler.record_stats()


def test_attaching_twice_is_refused_and_closed_profiler_refuses_use(tmp_path):
    model = nn.Linear(3, 3)
    first = MemoryProfiler(model, out_dir=tmp_path, print_period=0)
    with pytest.raises(ProfilerError, match="already attached"):
        MemoryProfiler(model, out_dir=tmp_path, print_period=0)
    first.close()
    first.close()  # idempotent
    with pytest.raises(ProfilerError, match="closed"):
        first.record_stats()
    second = MemoryProfiler(model, out_dir=tmp_path, print_period=0)
    second.close()
    assert load_trace(second.run_dir).meta["status"] == "closed"


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ProfilerError, match="nn.Module"):
        MemoryProfiler("model", out_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ProfilerError, match="print_period"):
        MemoryProfiler(nn.Linear(2, 2), out_dir=tmp_path, print_period=-1)


def test_console_report_uses_honest_units(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = io.StringIO()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=2, stream=out) as profiler:
        for _ in range(3):
            zoo.train_step(model, optimizer, (torch.randn(2, 4), torch.randint(0, 2, (2,))))
            profiler.record_stats()
    text = out.getvalue()
    assert text.count("memprof | iteration") == 2  # iterations 0 and 2
    # Linear(4, 3) holds (12 + 3) * 4 = 60 B and Linear(3, 2) (6 + 2) * 4 = 32 B: shown as such, never "0 MB"
    assert "60 B" in text and "32 B" in text and "MB" not in text
    assert "feature maps" in text and "weight_grads" in text


def test_epochs_and_run_directory(tmp_path):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="my-run", print_period=0) as profiler:
        for _epoch in range(2):
            for _ in range(2):
                zoo.train_step(model, optimizer, (torch.randn(2, 4), torch.randint(0, 2, (2,))))
                profiler.record_stats()
            profiler.epoch_end()
    assert profiler.run_dir == tmp_path / "my-run"
    trace = load_trace(profiler.run_dir)
    assert trace.iterations.epoch.tolist() == [0, 0, 1, 1]
    assert trace.meta["run_id"] == "my-run" and trace.meta["iterations"] == 4
    with pytest.raises(ProfilerError, match="already holds a trace"):
        MemoryProfiler(nn.Linear(1, 1), out_dir=tmp_path, run_id="my-run")


@pytest.mark.gpu
def test_cuda_allocated_bytes_are_the_caching_allocators(tmp_path):
    torch.manual_seed(0)
    model, make_batch = zoo.cnn()
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters())
    batches = [tuple(t.cuda() for t in make_batch(16)) for _ in range(3)]
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0) as profiler:
        for batch in batches:
            torch.cuda.reset_peak_memory_stats()
            zoo.train_step(model, optimizer, batch)
            profiler.record_stats()
            peak = torch.cuda.max_memory_allocated()
            allocated = torch.cuda.memory_allocated()
    trace = load_trace(profiler.run_dir)
    last = trace.iterations.iloc[-1]
    assert last.peak_allocated_bytes == peak
    # the caching allocator's own totals, not the categories' sum: at the end of the step too
    assert int(trace.events[trace.events.event == "end"].allocated_bytes.iloc[-1]) == allocated
    # in the allocator's blocks: each parameter's bytes rounded up to 512, as memory_allocated counts them
    assert last.weights == sum(round_size(p.numel() * 4) for p in model.parameters())
    assert last.peak_reserved_bytes >= last.peak_allocated_bytes


def test_gru_with_hidden_state_input(tmp_path):
    class GRUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(6, 12, batch_first=True)
            self.head = nn.Linear(12, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h0 = torch.zeros(1, x.shape[0], 12)
            out, h = self.gru(x, h0)  # a tuple in (input, hidden) and out (output, hidden)
            return self.head(out[:, -1] + h[0])

    trace = profile_steps(GRUNet(), lambda n: (torch.randn(n, 5, 6), torch.randint(0, 3, (n,))), tmp_path)
    gru = _layer(trace, 1, "gru")
    assert gru.input_bytes == 8 * 5 * 6 * 4 + 8 * 12 * 4  # the sequence and the initial hidden state
    assert gru.output_bytes >= 8 * 5 * 12 * 4 and gru.backward_ms > 0
    torch.manual_seed(0)
    expected = _saved_activation_bytes(GRUNet(), torch.randn(8, 5, 6))  # what autograd saves, the output
    assert [forward_exit(trace, i).feature_maps for i in range(3)] == [expected] * 3
