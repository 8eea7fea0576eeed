"""The native allocator reporter against its reference (torch.profiler's events), its fallback, its guard."""

from __future__ import annotations

import ctypes
import gc
import shutil
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zoo
from memprof import MemoryBudgetExceeded, MemoryProfiler, ProfilerError, load_trace
from memprof.capture.kineto import KinetoAllocationStream
from memprof.capture.native import build as native_build
from memprof.capture.native.stream import NativeAllocationStream
from memprof.capture.streams import open_stream

try:
    native_build.load()
    HAVE_NATIVE = True
except native_build.NativeBuildError:
    HAVE_NATIVE = False
needs_native = pytest.mark.skipif(not HAVE_NATIVE, reason="the native reporter cannot be built here")


def _in_session(events) -> tuple[np.ndarray, np.ndarray]:
    """Sizes of the allocations, and of the allocations and frees of blocks allocated in the session.

    Frees of older blocks depend on what earlier sessions saw (the CPU allocator reports the free of a
    block it saw allocated in any session), so they are left out of the comparison.
    """
    seen: set[int] = set()
    keep = []
    for ptr, size in zip(events.ptr.tolist(), events.size_bytes.tolist()):
        if size > 0:
            seen.add(ptr)
        keep.append(ptr in seen)
        if size < 0:
            seen.discard(ptr)
    sizes = events.size_bytes
    return sizes[sizes > 0], sizes[np.array(keep, dtype=bool)]


def _step_events(stream_type, model, optimizer, batch):
    zoo.train_step(model, optimizer, batch)  # warm: Adam's state and .grad exist before the measured step
    stream = stream_type(torch.device("cpu"))
    stream.start()
    try:
        zoo.train_step(model, optimizer, batch)
    finally:
        events = stream.close()
    return events


@needs_native
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm"])
def test_native_events_equal_torch_profilers(name):
    """Same step, both sources: the same allocations and frees, in the same order, with the same sizes."""
    torch.manual_seed(0)
    model, make_batch = getattr(zoo, name)()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    reference = _step_events(KinetoAllocationStream, model, optimizer, batch)
    native = _step_events(NativeAllocationStream, model, optimizer, batch)
    assert len(native) > 10
    for mine, theirs in zip(_in_session(native), _in_session(reference)):
        np.testing.assert_array_equal(mine, theirs)
    assert np.all(np.diff(native.time_ns) >= 0)
    # the allocator's running total moves by exactly each event's size
    np.testing.assert_array_equal(np.diff(native.total_allocated_bytes), native.size_bytes[1:])


@needs_native
def test_profiles_agree_between_sources(tmp_path, monkeypatch):
    """A whole profile: peaks and categories identical whichever source read the allocator."""
    traces = {}
    for source, switch in (("native", "1"), ("torch.profiler", "0")):
        monkeypatch.setenv(native_build.ENV_SWITCH, switch)
        native_build.load.cache_clear()
        torch.manual_seed(0)
        model, make_batch = zoo.mlp(blocks=3, width=64)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        batch = make_batch(16)
        with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id=source, print_period=0) as profiler:
            for _ in range(3):
                zoo.train_step(model, optimizer, batch)
                profiler.record_stats()
        traces[source] = load_trace(profiler.run_dir)
        assert traces[source].meta["allocator_source"] == source
    native_build.load.cache_clear()
    columns = ["peak_allocated_bytes", "allocated_bytes", "feature_maps", "weights", "optimizer_state",
               "weight_grads", "grads", "inputs"]
    native, reference = (traces[s].iterations[columns].reset_index(drop=True) for s in ("native", "torch.profiler"))
    assert native.equals(reference)


@needs_native
def test_native_stream_takes_the_profiler_slot_and_gives_it_back():
    stream = NativeAllocationStream(torch.device("cpu"))
    stream.start()
    try:
        assert torch.autograd._profiler_enabled()
        with pytest.raises(RuntimeError, match="already enabled"), torch.profiler.profile(profile_memory=True):
            pass
        second = NativeAllocationStream(torch.device("cpu"))
        with pytest.raises(ProfilerError, match="another torch.profiler"):
            second.start()
        before = stream.net_bytes()
        kept = torch.empty(1000, dtype=torch.uint8)
        assert stream.net_bytes() - before >= 1000
        del kept
    finally:
        stream.close()
    assert not torch.autograd._profiler_enabled()
    with torch.profiler.profile(profile_memory=True):  # the slot is free again
        torch.ones(3)


def test_build_failure_falls_back_to_torch_profiler(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr("memprof.capture.streams._warned", False)
    native_build.load.cache_clear()
    try:
        with pytest.raises(native_build.NativeBuildError, match="compiler failed"):
            native_build.build()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stream = open_stream(torch.device("cpu"))
        assert isinstance(stream, KinetoAllocationStream)
        assert any("torch.profiler instead" in str(w.message) for w in caught)
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.so"))
    finally:
        native_build.load.cache_clear()


@pytest.mark.slow
@needs_native
def test_a_compiler_refusing_the_quiet_part_gets_a_second_try_without_it(tmp_path, monkeypatch):
    """The part that names c10's private members is the one a future torch may break: without it the reporter
    still builds and reports (only c10's "unknown size" line may come back)."""
    real = shutil.which("c++") or shutil.which("g++")
    assert real is not None
    compiler = tmp_path / "cxx"  # a compiler that refuses any build keeping the quiet part
    compiler.write_text(f'#!/bin/sh\ncase " $* " in *" -DMEMPROF_NO_QUIET_FREES "*) exec {real} "$@";; esac\nexit 1\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("MEMPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(compiler))
    native_build.load.cache_clear()
    try:
        library = native_build.build()
        assert library.exists()
        assert native_build._declare(ctypes.CDLL(str(library))) is not None
    finally:
        native_build.load.cache_clear()


@needs_native
def test_guard_fires_inside_backward_on_cpu(tmp_path):
    """A wide layer on a tiny batch: forward fits the budget, the weight gradients of backward do not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = sum(p.numel() * 4 for p in model.parameters())
    budget = weights + 1024 * 1024  # the first layer's gradient alone is 4 MiB
    with pytest.raises(MemoryBudgetExceeded), \
            MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, budget_bytes=budget) as profiler:
        zoo.train_step(model, optimizer, (torch.randn(2, 1024), torch.tensor([1, 2])))
        profiler.record_stats()
    failure = load_trace(profiler.run_dir).meta["failure"]
    assert failure["phase"] == "backward"
    assert failure["allocated_bytes"] > budget


@needs_native
def test_a_dropped_stream_leaves_the_slot_free():
    """A stream garbage-collected without close() takes its reporter out of this thread's slot."""
    stream = NativeAllocationStream(torch.device("cpu"))
    stream.start()
    assert torch.autograd._profiler_enabled()
    del stream
    gc.collect()
    assert not torch.autograd._profiler_enabled()


def _flags_reference(columns: np.ndarray) -> int:
    """The reporter's drain flags by their definition: 1 for a row of another device than the CPU, 2 for a row
    whose time is before the one above it."""
    other = int(bool((columns[5] != 0).any()))
    unordered = int(bool((columns[0][1:] < columns[0][:-1]).any()))
    return other | 2 * unordered


@needs_native
def test_the_drained_columns_and_flags_are_the_reporters_rows():
    torch.manual_seed(0)
    model, make_batch = zoo.transformer(dim=32, heads=2, layers=2, seq=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = make_batch(4)
    stream = NativeAllocationStream(torch.device("cpu"))
    stream.start()
    try:
        zoo.train_step(model, optimizer, batch)
        columns, flags = stream._drain()
    finally:
        stream.close()
    assert columns.shape[0] == 7 and columns.shape[1] > 100
    assert all(column.flags.c_contiguous for column in columns)
    assert flags == _flags_reference(columns)
    assert (columns[2] != 0).all() and set(np.unique(columns[5]).tolist()) == {0}


@needs_native
@pytest.mark.parametrize("first_capacity", [1, 7, 1 << 16])
def test_a_drain_larger_than_its_buffer_takes_every_row_once_in_order(first_capacity, monkeypatch):
    """Rows beyond the buffer the last drain sized are taken by further calls into a bigger one: the same rows, the
    same net bytes, and the next drain's buffer fits them."""
    import memprof.capture.native.stream as native_stream

    monkeypatch.setattr(native_stream, "_FEWEST_ROWS", 1)
    stream = NativeAllocationStream(torch.device("cpu"))
    stream._capacity = first_capacity
    stream.start()
    try:
        kept = [torch.empty(64 * (i + 1), dtype=torch.uint8) for i in range(40)]
        del kept[::2]
        columns, flags = stream._drain()
        net, capacity = stream._info[2], stream._capacity
    finally:
        stream.close()
    assert columns.shape[1] == 60  # 40 allocations, 20 frees
    assert columns[2].tolist() == [64 * (i + 1) for i in range(40)] + [-64 * (i + 1) for i in range(0, 40, 2)]
    assert flags == _flags_reference(columns)
    assert all(column.flags.c_contiguous for column in columns)
    assert net == int(columns[2].sum())
    assert capacity >= 60


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from([0, 1]), st.sampled_from([-1, 0, 1])),
                min_size=0, max_size=30),
       st.sampled_from(["cpu", "cuda:0", "cuda:1"]))
def test_selecting_keeps_the_devices_rows_in_time_order(rows, device):
    """``_select`` against the rule it implements: this device's rows (a CUDA row of index -1 is the current
    device's), sorted by time, ties in the order they came."""
    columns = np.zeros((7, len(rows)), dtype=np.int64)
    for i, (time_ns, device_type, index) in enumerate(rows):
        columns[:, i] = (time_ns, 1000 + i, 8 * (i + 1), 100 * i, 7 * i, device_type, index)
    stream = NativeAllocationStream(torch.device(device))
    found = stream._select(columns, _flags_reference(columns))
    wanted_index = torch.device(device).index or 0
    on_cuda = device.startswith("cuda")
    keep = [i for i, (_, device_type, index) in enumerate(rows)
            if ((device_type == 1 and max(index, 0) == wanted_index) if on_cuda else device_type == 0)]
    keep.sort(key=lambda i: rows[i][0])
    assert found.ptr.tolist() == [1000 + i for i in keep]
    assert found.time_ns.tolist() == [rows[i][0] for i in keep]
    assert found.size_bytes.tolist() == [8 * (i + 1) for i in keep]
    reserved = [7 * i for i in keep] if on_cuda else [0] * len(keep)
    assert found.total_reserved_bytes.tolist() == reserved


@needs_native
def test_a_step_freeing_thousands_of_blocks_older_than_profiling_prints_nothing(capfd):
    """c10 logs "Memory block of unknown size ..." at its 1000th free of a block it did not see allocated since
    the last reset; the reporter resets that count every 64 events it records, so a step that frees 2,500 such
    blocks between its own allocations (a model built before profiling, dropped mid-run) says nothing."""
    old = [torch.empty(16) for _ in range(2500)]
    stream = NativeAllocationStream(torch.device("cpu"))
    stream.start()
    try:
        made = []
        for index in range(len(old)):
            old[index] = None  # a block c10 did not see allocated
            made.append(torch.empty(16))  # and one it did
        events = stream.collect()
    finally:
        stream.close()
    assert int((events.size_bytes > 0).sum()) >= len(made)  # the stream saw the step's own allocations
    assert "Memory block of unknown size" not in capfd.readouterr().err


@needs_native
def test_a_free_on_another_thread_is_recorded_and_the_allocator_given_back():
    import threading

    stream = NativeAllocationStream(torch.device("cpu"))
    stream.start()
    try:
        assert stream.watching_threads
        made = torch.empty(4096, dtype=torch.uint8)
        ptr = made.untyped_storage().data_ptr()
        box = [made]
        del made
        dropper = threading.Thread(target=box.clear)  # the last reference dropped there, as gloo's thread does
        dropper.start()
        dropper.join()
        events = stream.collect()
        rows = list(zip(events.ptr.tolist(), events.size_bytes.tolist()))
        assert (ptr, 4096) in rows and (ptr, -1) in rows  # the free: "the block at this address"
        assert rows.index((ptr, -1)) > rows.index((ptr, 4096))
        assert stream.foreign_frees == 1
        kept = torch.empty(4096, dtype=torch.uint8)  # freed on this thread: reported by c10, not twice
        del kept
        assert stream.foreign_frees == 1 and sum(size == -1 for size in stream.collect().size_bytes.tolist()) == 0
    finally:
        stream.close()
    assert not stream.watching_threads
    late = torch.empty(16, dtype=torch.uint8)  # allocated after close: no longer seen through, freed anywhere
    box = [late]
    del late
    dropper = threading.Thread(target=box.clear)
    dropper.start()
    dropper.join()
    assert stream.foreign_frees == 1


@needs_native
def test_a_profiled_step_whose_tensors_another_thread_frees_does_not_drift(tmp_path):
    import threading

    # the allocated bytes at each iteration's end against the tensors the script holds (the oracle: what the
    # garbage collector finds alive), while a tensor made in each step is dropped on another thread in the next
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    held: list[torch.Tensor] = []
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for step in range(5):
            optimizer.zero_grad(set_to_none=True)
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            held.append(torch.empty(1 << 16, dtype=torch.uint8))
            if step:
                dropper = threading.Thread(target=held.pop, args=(0,))
                dropper.start()
                dropper.join()
            profiler.record_stats()
    alive = sum(t.untyped_storage().nbytes() for t in gc.get_objects() if isinstance(t, torch.Tensor)
                and t.device.type == "cpu" and any(t is h for h in (*held, *model.parameters(),
                                                                     *(p.grad for p in model.parameters()))))
    ends = load_trace(profiler.run_dir).events.groupby("iteration").allocated_bytes.last()
    assert ends.tolist() == [alive] * 5, (ends.tolist(), alive)
