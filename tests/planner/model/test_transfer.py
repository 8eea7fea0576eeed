"""Transfer costs: validation, units, JSON on their own and inside a chain, the default, measuring, traces."""

from __future__ import annotations

import math
import time

import pytest
import torch

from examples import zoo
from memprof import MemoryProfiler, load_trace
from planner import chain_from_trace
from planner.errors import ChainError
from planner.measure.bandwidth import measure_transfer_bandwidth
from planner.model.chain import Chain
from planner.model.transfer import DEFAULT_GBPS, DEFAULT_TRANSFER, TransferCosts, gbps_to_bytes_per_ms
from tests.planner.chain_strategies import random_chain, toy_chain


def test_units_and_copy_times() -> None:
    costs = TransferCosts.from_gbps(24.0, 12.0, 2**30)
    assert costs.d2h_bytes_per_ms == gbps_to_bytes_per_ms(24.0) == 24e6
    assert costs.d2h_ms(48 * 10**6) == 2.0 and costs.h2d_ms(48 * 10**6) == 4.0
    assert costs.d2h_ms(0) == 0.0
    assert TransferCosts(0.0, 1.0).d2h_ms(1) == math.inf and not TransferCosts(0.0, 1.0).usable
    assert TransferCosts(math.inf, math.inf).h2d_ms(10**12) == 0.0
    assert not TransferCosts(1.0, 1.0, 0).usable and TransferCosts(1.0, 1.0, 5).host_fits(5)
    assert "24.0 GB/s out, 12.0 GB/s in" in costs.describe()


def test_the_default_is_documented_pcie4() -> None:
    assert DEFAULT_GBPS == 24.0
    assert DEFAULT_TRANSFER.source == "default" and not DEFAULT_TRANSFER.measured
    assert DEFAULT_TRANSFER.host_cap_bytes is None
    assert random_chain(seed=1, length=3).transfer_costs == DEFAULT_TRANSFER  # a chain without its own


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"d2h_bytes_per_ms": -1.0, "h2d_bytes_per_ms": 1.0}, "d2h_bytes_per_ms must be a number >= 0"),
    ({"d2h_bytes_per_ms": 1.0, "h2d_bytes_per_ms": math.nan}, "h2d_bytes_per_ms must be a number >= 0"),
    ({"d2h_bytes_per_ms": True, "h2d_bytes_per_ms": 1.0}, "d2h_bytes_per_ms must be a number"),
    ({"d2h_bytes_per_ms": 1.0, "h2d_bytes_per_ms": 1.0, "host_cap_bytes": -5}, "host_cap_bytes must be a whole"),
    ({"d2h_bytes_per_ms": 1.0, "h2d_bytes_per_ms": 1.0, "host_cap_bytes": 1.5}, "host_cap_bytes must be a whole"),
])
def test_bad_values_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ChainError, match=message):
        TransferCosts(**kwargs)


def test_json_round_trip_on_its_own_and_in_a_chain() -> None:
    costs = TransferCosts(math.inf, 1.5e6, 10**9, "measured:test")
    assert costs.to_dict()["d2h_bytes_per_ms"] == "inf"
    assert TransferCosts.from_dict(costs.to_dict()) == costs and costs.measured
    chain = toy_chain().with_transfer(costs)
    again = Chain.from_json(chain.to_json())
    assert again.transfer == costs and again == chain
    assert again.fingerprint() == toy_chain().fingerprint()  # a schedule stays valid whatever the link
    assert "transfer" not in toy_chain().to_dict() and Chain.from_json(toy_chain().to_json()).transfer is None


@pytest.mark.parametrize(("raw", "message"), [
    ([], "transfer costs must be an object"),
    ({"d2h_bytes_per_ms": 1.0}, r"transfer costs lack \['h2d_bytes_per_ms'\]"),
    ({"d2h_bytes_per_ms": "fast", "h2d_bytes_per_ms": 1.0}, 'a bandwidth must be a number of bytes per ms or "inf"'),
])
def test_bad_transfer_json_is_refused(raw: object, message: str) -> None:
    with pytest.raises(ChainError, match=message):
        Chain.from_json({**toy_chain().to_dict(), "transfer": raw})


def test_measuring_without_cuda_returns_the_default() -> None:
    costs = measure_transfer_bandwidth("cpu", host_cap_bytes=123)
    assert (costs.d2h_bytes_per_ms, costs.h2d_bytes_per_ms) == (DEFAULT_TRANSFER.d2h_bytes_per_ms,
                                                                  DEFAULT_TRANSFER.h2d_bytes_per_ms)
    assert costs.source == "default" and costs.host_cap_bytes == 123
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_transfer_bandwidth("cpu", repeats=0)


@pytest.mark.gpu
def test_measuring_on_cuda_gives_a_plausible_link() -> None:
    costs = measure_transfer_bandwidth("cuda", size_bytes=16 * 2**20, repeats=3)
    assert costs.measured and costs.source.startswith("measured:")
    # The test's own clock: a 64 MiB pinned copy each way, timed on the wall between synchronisations (the
    # launch costs microseconds against the milliseconds of the copy). CUDA events on a 16 MiB copy and this
    # must agree within the spread of two timings of one link, not within a factor of ten thousand.
    host = torch.empty(64 * 2**20, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    own = {}
    for name, copy in (("d2h", lambda: host.copy_(device, non_blocking=True)),
                       ("h2d", lambda: device.copy_(host, non_blocking=True))):
        copy()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        own[name] = host.numel() / (sorted(times)[2] * 1e3)  # bytes per ms, the median
    for name, rate in (("d2h", costs.d2h_bytes_per_ms), ("h2d", costs.h2d_bytes_per_ms)):
        assert 0.7 * own[name] <= rate <= 1.5 * own[name], (name, rate, own)
        # a host link: from PCIe 3 x8 (about 6 GB/s pinned) to NVLink-C2C (about 450 GB/s each way)
        assert 2e6 < rate < 6e8, (name, rate)


def test_a_chain_from_a_trace_takes_the_stored_bandwidth(tmp_path) -> None:
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=32, in_features=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stored = TransferCosts.from_gbps(11.0, 13.0, None, "measured:test device")
    runs = {}
    for name, meta in (("plain", None), ("measured", {"transfer": stored.to_dict()})):
        with MemoryProfiler(model, optimizer, out_dir=tmp_path / name, print_period=0, extra_meta=meta) as profiler:
            for _ in range(3):
                zoo.train_step(model, optimizer, make_batch(8))
                profiler.record_stats()
        runs[name] = chain_from_trace(load_trace(profiler.run_dir))
    assert runs["measured"].transfer == stored
    assert runs["plain"].transfer is None and runs["plain"].transfer_costs == DEFAULT_TRANSFER
