"""The cost of moving saved activations between device and host memory (tensor streaming).

A chain may carry :class:`TransferCosts`: the device-to-host and host-to-device bandwidths of its device
and a cap on the host memory that offloaded activations may take. A chain without them (every chain
written before offloading existed, a hand-written one) uses :data:`DEFAULT_TRANSFER`, documented below.

Defaults. Pinned-memory copies over PCIe 4.0 x16 (16 GT/s x 16 lanes, 31.5 GB/s of raw bandwidth after
128b/130b encoding) reach about 24 GB/s device-to-host and 25 GB/s host-to-device in ``cudaMemcpyAsync``
from and to page-locked memory on A100-class machines (the copy engine, DMA descriptors and TLP headers
take the rest). :data:`DEFAULT_TRANSFER` uses 24 GB/s (1 GB = 10^9 bytes) in both directions, the lower
of the two, and no host cap. :func:`planner.measure.bandwidth.measure_transfer_bandwidth` measures the real
values on a CUDA device; chains built from a trace take them from the trace's ``meta.json`` key
``transfer`` when the run stored one (see docs/trace-format.md).

Bandwidths are kept in bytes per millisecond, the unit the simulator's times use; ``math.inf`` means
transfers take no time and ``0`` that there is no link (every transfer would take forever, so no schedule
offloads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memprof.units import format_bytes
from planner.errors import ChainError

GB = 10**9
BYTES_PER_MS_PER_GBPS = GB / 1000
"""1 GB/s in bytes per millisecond."""

DEFAULT_GBPS = 24.0
"""The documented default bandwidth of each direction, GB/s (PCIe 4.0 x16, pinned memory; see above)."""


def gbps_to_bytes_per_ms(gbps: float) -> float:
    """``gbps`` GB/s (10^9 bytes per second) in bytes per millisecond."""
    return float(gbps) * BYTES_PER_MS_PER_GBPS


@dataclass(frozen=True)
class TransferCosts:
    """Bandwidths between device and host memory, and how much host memory offloading may take.

    Attributes:
        d2h_bytes_per_ms: device-to-host bandwidth (offloads), bytes per ms; ``inf``: instantaneous.
        h2d_bytes_per_ms: host-to-device bandwidth (prefetches), bytes per ms.
        host_cap_bytes: the most host memory offloaded activations may hold at once (``None``: no cap).
        source: where the bandwidths come from: ``"default"`` (:data:`DEFAULT_TRANSFER`), ``"measured"``
            (:func:`planner.measure.bandwidth.measure_transfer_bandwidth`, with the device's name after a
            colon) or ``"given"`` (set by hand).
    """

    d2h_bytes_per_ms: float
    h2d_bytes_per_ms: float
    host_cap_bytes: int | None = None
    source: str = "given"

    def __post_init__(self) -> None:
        for key in ("d2h_bytes_per_ms", "h2d_bytes_per_ms"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ChainError(f"transfer costs: {key} must be a number >= 0 (inf allowed), found {value!r}")
            object.__setattr__(self, key, float(value))
        cap = self.host_cap_bytes
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ChainError(f"transfer costs: host_cap_bytes must be a whole number of bytes >= 0 or None, found {cap!r}")
        if not isinstance(self.source, str):
            raise ChainError(f"transfer costs: source must be a string, found {self.source!r}")

    @property
    def measured(self) -> bool:
        """Whether the bandwidths were measured on a device (rather than the default or given by hand)."""
        return self.source.startswith("measured")

    def d2h_ms(self, size_bytes: int) -> float:
        """Time to copy ``size_bytes`` from device to host (inf without a link)."""
        return _copy_ms(size_bytes, self.d2h_bytes_per_ms)

    def h2d_ms(self, size_bytes: int) -> float:
        """Time to copy ``size_bytes`` from host to device (inf without a link)."""
        return _copy_ms(size_bytes, self.h2d_bytes_per_ms)

    def host_fits(self, size_bytes: int) -> bool:
        """Whether ``size_bytes`` of offloaded activations fit the host cap."""
        return self.host_cap_bytes is None or size_bytes <= self.host_cap_bytes

    @property
    def usable(self) -> bool:
        """Whether any offload can complete: both links up and some host memory allowed."""
        return self.d2h_bytes_per_ms > 0 and self.h2d_bytes_per_ms > 0 and self.host_cap_bytes != 0

    def describe(self) -> str:
        """``"24.0 GB/s out, 24.0 GB/s in, no host cap (default)"``: for messages and the CLI."""
        def rate(value: float) -> str:
            return "unlimited" if math.isinf(value) else f"{value / BYTES_PER_MS_PER_GBPS:.1f} GB/s"

        cap = "no host cap" if self.host_cap_bytes is None else f"host cap {format_bytes(self.host_cap_bytes)}"
        return f"{rate(self.d2h_bytes_per_ms)} out, {rate(self.h2d_bytes_per_ms)} in, {cap} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON-compatible form :meth:`from_dict` reads (an infinite bandwidth is the string ``"inf"``)."""
        return {
            "d2h_bytes_per_ms": "inf" if math.isinf(self.d2h_bytes_per_ms) else self.d2h_bytes_per_ms,
            "h2d_bytes_per_ms": "inf" if math.isinf(self.h2d_bytes_per_ms) else self.h2d_bytes_per_ms,
            "host_cap_bytes": self.host_cap_bytes,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TransferCosts:
        """Reads transfer costs from a dict (``host_cap_bytes`` and ``source`` optional).

        Raises:
            ChainError: not a mapping, a bandwidth missing, or a value out of range.
        """
        if not isinstance(raw, Mapping):
            raise ChainError(f"transfer costs must be an object, found {type(raw).__name__}")
        missing = [k for k in ("d2h_bytes_per_ms", "h2d_bytes_per_ms") if k not in raw]
        if missing:
            raise ChainError(f"transfer costs lack {missing}; expected d2h_bytes_per_ms and h2d_bytes_per_ms "
                             "(bytes per millisecond) and optionally host_cap_bytes and source")
        cap = raw.get("host_cap_bytes")
        if isinstance(cap, float) and cap.is_integer():
            cap = int(cap)
        return cls(_rate(raw["d2h_bytes_per_ms"]), _rate(raw["h2d_bytes_per_ms"]), cap,
                   str(raw.get("source", "given")))

    @classmethod
    def from_gbps(cls, d2h_gbps: float, h2d_gbps: float, host_cap_bytes: int | None = None,
                  source: str = "given") -> TransferCosts:
        """Transfer costs from bandwidths in GB/s (10^9 bytes per second)."""
        return cls(gbps_to_bytes_per_ms(d2h_gbps), gbps_to_bytes_per_ms(h2d_gbps), host_cap_bytes, source)


def _copy_ms(size_bytes: int, rate: float) -> float:
    if size_bytes <= 0:
        return 0.0
    return math.inf if rate == 0 else size_bytes / rate


def _rate(value: Any) -> float:
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ChainError(f"transfer costs: a bandwidth must be a number of bytes per ms or \"inf\", found {value!r}")
    return float(value)


DEFAULT_TRANSFER = TransferCosts.from_gbps(DEFAULT_GBPS, DEFAULT_GBPS, None, "default")
"""What a chain without transfer costs uses: 24 GB/s each way, no host cap (see the module docstring)."""
