"""``snapshot_on_oom``: PyTorch's allocation history recorded on CUDA and dumped beside the post-mortem."""

from __future__ import annotations

import gc
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from examples import zoo
from memprof import MemoryProfiler, ProfilerError, load_trace
from memprof.capture import oom_snapshot as module
from memprof.capture.oom_snapshot import NEEDS_CUDA, SNAPSHOT_FILE, OomSnapshot
from memprof.interop import import_snapshot
from tests.memprof.interop.snapshots import training_snapshot


class _RunsOutOfMemory(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


class FakeMemory:
    """Stands in for ``torch.cuda.memory``: records the calls, dumps a hand-built snapshot."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[dict] = []
        self.fail = fail

    def _record_memory_history(self, **kwargs) -> None:
        self.calls.append(kwargs)

    def _dump_snapshot(self, filename: str) -> None:
        if self.fail:
            raise RuntimeError("dump refused")
        Path(filename).write_bytes(pickle.dumps(training_snapshot().builder.snapshot()))


def _failing_step(tmp_path: Path, **kwargs) -> MemoryProfiler:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), _RunsOutOfMemory())
    with pytest.raises(torch.OutOfMemoryError), \
            MemoryProfiler(model, out_dir=tmp_path, print_period=0, background=False, **kwargs) as profiler:
        model(torch.randn(2, 8)).sum().backward()
        profiler.record_stats()
    return profiler


def test_on_cpu_it_warns_once_and_does_nothing(tmp_path):
    with pytest.warns(RuntimeWarning, match="needs a CUDA device") as caught:
        profiler = _failing_step(tmp_path, snapshot_on_oom=True)
    assert sum(NEEDS_CUDA in str(w.message) for w in caught) == 1
    assert not (profiler.run_dir / SNAPSHOT_FILE).exists()
    assert "snapshot" not in load_trace(profiler.run_dir).meta["failure"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # off by default: no warning
        _failing_step(tmp_path / "off")


def test_a_bad_value_is_refused(tmp_path):
    with pytest.raises(ProfilerError, match="snapshot_on_oom must be True or False"):
        MemoryProfiler(torch.nn.Linear(2, 2), out_dir=tmp_path, snapshot_on_oom="yes")  # type: ignore[arg-type]


def test_recording_is_started_dumped_and_stopped(tmp_path, monkeypatch):
    fake = FakeMemory()
    monkeypatch.setattr(module, "_history_enabled", lambda: False)
    recorder = OomSnapshot(torch.device("cuda", 0), max_entries=1234, memory=fake)
    recorder.start()
    assert fake.calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 1234,
                           "clear_history": True}]
    path = recorder.dump(tmp_path)
    assert path == tmp_path / SNAPSHOT_FILE and recorder.dump(tmp_path) == path  # once
    assert [p.name for p in tmp_path.iterdir()] == [SNAPSHOT_FILE]  # no temporary file left
    recorder.stop()
    recorder.stop()
    assert fake.calls[1:] == [{"enabled": None}]
    # the file is a snapshot memprof imports
    trace = load_trace(import_snapshot(path, tmp_path / "imported"))
    assert trace.iterations.peak_allocated_bytes.tolist() == [88576, 111104]


def test_recording_someone_else_started_is_left_on(tmp_path, monkeypatch):
    fake = FakeMemory()
    monkeypatch.setattr(module, "_history_enabled", lambda: True)
    recorder = OomSnapshot(torch.device("cuda"), memory=fake)
    recorder.start()
    assert recorder.dump(tmp_path) is not None
    recorder.stop()
    assert fake.calls == []


def test_a_failed_dump_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "_history_enabled", lambda: False)
    recorder = OomSnapshot(torch.device("cuda"), memory=FakeMemory(fail=True))
    with pytest.warns(RuntimeWarning, match="could not write the allocation snapshot"):
        assert recorder.dump(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_the_profiler_dumps_beside_the_post_mortem(tmp_path, monkeypatch):
    """The profiler's out-of-memory path, with a CUDA recorder over the stand-in module."""
    fake = FakeMemory()
    monkeypatch.setattr(module, "_history_enabled", lambda: False)
    monkeypatch.setattr("memprof.capture.profiler.OomSnapshot",
                        lambda device: OomSnapshot(torch.device("cuda"), memory=fake))
    profiler = _failing_step(tmp_path, snapshot_on_oom=True)
    failure = load_trace(profiler.run_dir).meta["failure"]
    assert failure["kind"] == "oom" and failure["snapshot"] == SNAPSHOT_FILE
    assert (profiler.run_dir / SNAPSHOT_FILE).is_file()
    assert fake.calls[0]["enabled"] == "all" and fake.calls[-1] == {"enabled": None}  # stopped at close
    assert fake.calls[0]["clear_history"] is True  # an earlier recording's entries are not this run's


def _cuda_steps_until_oom(tmp_path: Path, snapshot_on_oom: bool = True) -> tuple[MemoryProfiler, int]:
    """Three Adam steps of an MLP on CUDA, then a petabyte asked for: the profiler records the failure."""
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=2, width=256, in_features=64)
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(torch.OutOfMemoryError), MemoryProfiler(
            model, optimizer, out_dir=tmp_path, print_period=0, snapshot_on_oom=snapshot_on_oom) as profiler:
        for _ in range(3):
            inputs, targets = (t.cuda() for t in make_batch(32))
            zoo.train_step(model, optimizer, (inputs, targets))
            profiler.record_stats()
        torch.empty(2**50, dtype=torch.uint8, device="cuda")  # always refused
    return profiler, weights


@pytest.mark.gpu
def test_a_real_cuda_out_of_memory_leaves_a_snapshot_memprof_imports(tmp_path):
    profiler, weights = _cuda_steps_until_oom(tmp_path)
    assert not torch._C._cuda_isHistoryEnabled()  # the profiler turned it on, and off again at close
    path = profiler.run_dir / SNAPSHOT_FILE
    assert load_trace(profiler.run_dir).meta["failure"]["snapshot"] == SNAPSHOT_FILE
    trace = load_trace(import_snapshot(path, tmp_path / "imported"))
    rows = trace.iterations
    assert len(rows) == 3 and trace.meta["failure"]["kind"] == "oom"
    # Adam's two moments were allocated under torch/optim in the first step: their requested sizes are exact
    assert int(rows.iloc[1].optimizer_state) == 2 * weights
    assert int(rows.peak_allocated_bytes.max()) <= torch.cuda.max_memory_allocated()


@pytest.mark.gpu
def test_recording_started_before_the_model_sees_its_weights(tmp_path):
    # The earlier test's model and Adam state are still on the device while the out-of-memory error's traceback
    # (a reference cycle through its frames) waits for the garbage collector; the snapshot would rightly show
    # them, as live blocks with their stacks. And a fresh recording: PyTorch keeps an earlier one's entries.
    gc.collect()
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python", clear_history=True)
    try:
        profiler, weights = _cuda_steps_until_oom(tmp_path)
        assert torch._C._cuda_isHistoryEnabled()  # someone else's recording is left on
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = load_trace(import_snapshot(profiler.run_dir / SNAPSHOT_FILE, tmp_path / "imported"))
    row = trace.iterations.iloc[1]  # a whole step: weights and Adam's state live throughout
    assert int(row.weights) == weights and int(row.optimizer_state) == 2 * weights
    layers = trace.layers[trace.layers.iteration == 1]
    assert (layers.feature_map_bytes > 0).sum() >= 3  # the Linear and ReLU calls keep their outputs


def test_a_torch_without_clear_history_still_records(monkeypatch):
    class OldMemory(FakeMemory):
        def _record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=1) -> None:
            self.calls.append({"enabled": enabled, "max_entries": max_entries})

    monkeypatch.setattr(module, "_history_enabled", lambda: False)
    old = OldMemory()
    recorder = OomSnapshot(torch.device("cuda", 0), max_entries=7, memory=old)
    recorder.start()
    assert old.calls == [{"enabled": "all", "max_entries": 7}] and recorder.started
