"""The fake allocation stream: an allocation per new storage, none for views and in-place operators, a free
when the last tensor dies; the caching allocator's blocks on CUDA; the kernels' workspace; the virtual clock."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memprof.capture.hooks import now_ns, use_clock
from memprof.capture.tensor_walk import storage_address
from memprof.estimation.clock import ROOFLINES, Roofline, VirtualClock
from memprof.estimation.stream import FakeAllocationStream
from memprof.estimation.workspace import WorkspaceProbe

aten = torch.ops.aten


def _events(stream: FakeAllocationStream) -> list[tuple[int, int]]:
    events = stream.collect()
    return list(zip(events.ptr.tolist(), events.size_bytes.tolist()))


def test_new_storages_views_in_place_and_frees():
    with FakeTensorMode():
        stream = FakeAllocationStream("cpu")
        stream.start()
        try:
            x = torch.empty(4, 8)
            address = storage_address(x.untyped_storage())
            assert _events(stream) == [(address, 128)]
            view = x.view(32)[2:]
            x.add_(1)
            x.transpose(0, 1).mul_(2)
            assert _events(stream) == []  # views and in-place operators allocate nothing
            y = x + 1
            y_address = storage_address(y.untyped_storage())
            assert stream.net_bytes() == 128
            del y
            assert _events(stream) == [(y_address, 128), (y_address, -128)]
            torch.empty(0)  # an empty storage: neither allocator reports it
            assert _events(stream) == []
            del x
            assert _events(stream) == []  # the view still holds the storage
            del view
            assert _events(stream) == [(address, -128)]
        finally:
            stream.close()
        torch.empty(16)  # after close: not seen
        assert _events(stream) == []


def test_adopted_storages_report_only_their_free():
    with FakeTensorMode():
        weight = torch.empty(10, 10)  # made before the stream starts, as a model's weights are
        stream = FakeAllocationStream("cpu")
        stream.start()
        try:
            address = storage_address(weight.untyped_storage())
            stream.adopt([weight])
            assert _events(stream) == []
            del weight
            assert _events(stream) == [(address, -400)]
        finally:
            stream.close()


def test_cuda_blocks_and_reserved_bytes():
    with FakeTensorMode():
        stream = FakeAllocationStream("cuda")
        stream.start()
        try:
            small, large = torch.empty(3), torch.empty(3 << 18)  # 12 bytes; 3 MiB
            events = stream.collect()
            assert events.size_bytes.tolist() == [512, 3 << 20]
            assert events.total_reserved_bytes.tolist() == [2 << 20, 22 << 20]
            assert stream.reserved_bytes() == 22 << 20
            del small, large
            events = stream.collect()
            assert events.size_bytes.tolist() == [-512, -(3 << 20)]
            assert stream.reserved_bytes() == 22 << 20  # cached, not given back
        finally:
            stream.close()


def test_a_probed_kernel_reports_its_workspace_around_its_outputs():
    conv = (aten.convolution.default, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    x_real, w_real = torch.randn(4, 16, 16, 16), torch.randn(16, 16, 3, 3)
    probe = WorkspaceProbe()
    with FakeTensorMode() as mode:
        x, w = mode.from_tensor(x_real), mode.from_tensor(w_real)
        stream = FakeAllocationStream("cpu", probe)
        stream.start()
        try:
            out = torch.ops.aten.convolution.default(x, w, None, *conv[1:])
            sizes = stream.collect().size_bytes.tolist()
        finally:
            stream.close()
    workspace = probe.workspace_bytes(conv[0], (x, w, None, *conv[1:]), {})
    assert workspace > 0  # oneDNN's blocked copies of the input and the weight
    assert sizes == [workspace, out.numel() * 4, -workspace]


def test_the_workspace_of_a_cut_batch_extrapolates_to_the_full_one(monkeypatch):
    import memprof.estimation.workspace as workspace_module

    args = (torch.Size([16, 16, 32, 32]), torch.Size([16, 16, 3, 3]))
    with FakeTensorMode():
        x, w = torch.empty(args[0]), torch.empty(args[1])
        grad = torch.empty(args[0])
    forward = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    backward = (grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    full = [WorkspaceProbe().workspace_bytes(aten.convolution.default, forward, {}),
            WorkspaceProbe().workspace_bytes(aten.convolution_backward.default, backward, {})]
    monkeypatch.setattr(workspace_module, "PROBE_LIMIT_BYTES", 0)  # every probe cuts the batch to 2 and 4
    cut = [WorkspaceProbe().workspace_bytes(aten.convolution.default, forward, {}),
           WorkspaceProbe().workspace_bytes(aten.convolution_backward.default, backward, {})]
    assert cut == full and min(full) > 0


def test_operators_not_probed_have_no_workspace_and_a_running_profiler_is_left_alone():
    probe = WorkspaceProbe()
    with FakeTensorMode():
        x = torch.empty(8, 8)
        assert probe.workspace_bytes(aten.mm.default, (x, x), {}) == 0
        bn = (x.view(8, 8, 1, 1), torch.empty(8), torch.empty(8), None, None, True, 0.1, 1e-5)
    with torch.profiler.profile(profile_memory=True), pytest.warns(RuntimeWarning, match="cannot measure"):
        assert probe.workspace_bytes(aten.native_batch_norm.default, bn, {}) == 0


def test_the_virtual_clock_advances_by_the_roofline():
    roofline = Roofline(flops_per_s=1e9, bytes_per_s=1e9, op_overhead_ns=100)
    clock = VirtualClock(roofline, start_ns=1_000)
    assert [clock(), clock()] == [1_001, 1_002]  # every read is distinct
    with FakeTensorMode():
        a, b = torch.empty(64, 32), torch.empty(32, 16)
        out = torch.mm(a, b)
        # 2*64*32*16 = 65,536 FLOPs: 65.5 us; (2048 + 512 + 1024) floats = 14,336 bytes: 14.3 us
        assert clock.op_ns(aten.mm.default, (a, b), {}, out) == 100 + 65_536
        assert clock.op_ns(aten.view.default, (a, [2048]), {}, a.view(2048)) == 100  # a view moves nothing
        added = a + 1
        assert clock.op_ns(aten.add.Tensor, (a, 1), {}, added) == 100 + 2 * 64 * 32 * 4
    clock.advance(aten.mm.default, (a, b), {}, out)
    assert clock() == 1_003 + 100 + 65_536
    with use_clock(clock):
        assert now_ns() == 1_004 + 100 + 65_536
    assert set(ROOFLINES) == {"cpu", "cuda"}
    with pytest.raises(ValueError, match="positive rates"):
        Roofline(0, 1, 0)


def test_estimates_are_deterministic(tmp_path):
    from memprof import estimate, load_trace
    from tests.memprof.estimation.cases import CASES, OPTIMIZERS

    layers = []
    for name in ("a", "b"):
        model, batch, loss_fn = CASES["llama_style"].build()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and quiet
            found = estimate(model, batch, loss_fn, OPTIMIZERS["adam"], out_dir=tmp_path / name)
        table = load_trace(found.run_dir).layers
        layers.append(table[["module", "forward_ms", "backward_ms", "output_bytes", "saved_bytes"]])
    assert layers[0].equals(layers[1])


def test_a_cuda_probe_measures_only_cudas_workspace_kernels():
    """On CUDA only convolutions are probed (cuDNN's workspace); CPU-only workspaces are none of CUDA's."""
    import memprof.estimation.workspace as workspace_module

    probe = WorkspaceProbe(device="cuda", measure=lambda call: pytest.fail("no probe expected"))
    assert set(workspace_module.PROBED_CUDA) == {aten.convolution.default, aten.convolution_backward.default}
    with FakeTensorMode():
        x = torch.empty(8, 8)
        bn = (x.view(8, 8, 1, 1), torch.empty(8), torch.empty(8), None, None, True, 0.1, 1e-5)
        assert probe.workspace_bytes(aten.native_batch_norm.default, bn, {}) == 0
        assert probe.workspace_bytes(aten.native_layer_norm_backward.default, (x,) * 5, {}) == 0
