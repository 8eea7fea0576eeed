"""Measuring a device's transfer bandwidths once, to store with a trace (pure torch).

A training script measures before profiling and passes the result to the profiler, so chains built from the
run use the real values::

    transfer = measure_transfer_bandwidth(torch.device("cuda"))
    MemoryProfiler(model, optimizer, extra_meta={"transfer": transfer.to_dict()}, ...)

On a machine without CUDA (or for a CPU device) there is no link to measure: the documented default
:data:`planner.model.transfer.DEFAULT_TRANSFER` is returned, its ``source`` saying ``"default"``.
"""

from __future__ import annotations

import statistics

import torch

from planner.model.transfer import DEFAULT_TRANSFER, TransferCosts

MEASURE_BYTES = 64 * 2**20
"""Size of the timed copy: large enough that the per-copy launch cost (about 10 us) is under 1%."""


def measure_transfer_bandwidth(device: torch.device | str, size_bytes: int = MEASURE_BYTES, repeats: int = 5,
                               host_cap_bytes: int | None = None) -> TransferCosts:
    """Times pinned-memory copies each way on ``device`` and returns the median bandwidths.

    Args:
        device: a CUDA device; any other device returns :data:`~planner.model.transfer.DEFAULT_TRANSFER`.
        size_bytes: bytes per timed copy.
        repeats: timed copies per direction (after one untimed warm-up); the median is kept.
        host_cap_bytes: the host cap to store beside the bandwidths (``None``: no cap).

    Raises:
        ValueError: ``size_bytes`` or ``repeats`` below 1.
    """
    if size_bytes < 1 or repeats < 1:
        raise ValueError(f"size_bytes and repeats must be >= 1, found {size_bytes} and {repeats}")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return TransferCosts(DEFAULT_TRANSFER.d2h_bytes_per_ms, DEFAULT_TRANSFER.h2d_bytes_per_ms, host_cap_bytes,
                             "default")
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    d2h = _median_ms(lambda: host.copy_(on_device, non_blocking=True), device, repeats)
    h2d = _median_ms(lambda: on_device.copy_(host, non_blocking=True), device, repeats)
    name = torch.cuda.get_device_name(device)
    return TransferCosts(size_bytes / d2h, size_bytes / h2d, host_cap_bytes, f"measured:{name}")


def _median_ms(copy, device: torch.device, repeats: int) -> float:
    """Median time in ms of ``copy()`` on ``device``'s current stream, timed by CUDA events."""
    copy()  # warm-up: first-touch of the pages, the copy engine's set-up
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return max(statistics.median(times), 1e-6)
