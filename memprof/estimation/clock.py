"""A virtual clock for estimates: each operator takes the time a roofline model predicts for it.

Fake tensors run no kernels, so the wall clock of an estimate measures Python's dispatch, not the step. The
estimate stamps its marks and events with :class:`VirtualClock` instead, which advances by each operator's
predicted time: the larger of its floating-point work at the device's arithmetic rate and the bytes it
reads and writes at the device's memory bandwidth, plus a fixed cost per operator (a kernel launch). The
per-layer ``forward_ms`` and ``backward_ms`` of an estimate's trace, and its ``step_ms``, come from this
clock; so do the planner's makespans on an estimate's chain, whose ratios (a schedule's time against
store-all's) matter more than the absolute times. FLOPs are counted by ``torch.utils.flop_counter`` (matrix
products, convolutions, attention); views move no bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from torch.utils.flop_counter import flop_registry

from memprof.capture.tensor_walk import tensors

__all__ = ["ROOFLINES", "Roofline", "VirtualClock"]


@dataclass(frozen=True)
class Roofline:
    """A device's speed, as a roofline model sees it.

    Attributes:
        flops_per_s: floating-point operations per second (a realistic float32 rate, not the peak).
        bytes_per_s: memory bandwidth.
        op_overhead_ns: fixed cost of one operator (dispatch, kernel launch).
    """

    flops_per_s: float
    bytes_per_s: float
    op_overhead_ns: int

    def __post_init__(self) -> None:
        if not (self.flops_per_s > 0 and self.bytes_per_s > 0 and self.op_overhead_ns >= 0):
            raise ValueError(f"a roofline needs positive rates and a non-negative overhead, found {self}")

    def op_ns(self, flops: float, nbytes: float) -> int:
        """Predicted nanoseconds of one operator doing ``flops`` and moving ``nbytes``."""
        return self.op_overhead_ns + int(max(flops / self.flops_per_s, nbytes / self.bytes_per_s) * 1e9)


#: Default rooflines: a few cores of a server CPU, and a data-centre GPU in float32 (TF32 off).
ROOFLINES: dict[str, Roofline] = {
    "cpu": Roofline(flops_per_s=2e11, bytes_per_s=2e10, op_overhead_ns=2_000),
    "cuda": Roofline(flops_per_s=4e13, bytes_per_s=2e12, op_overhead_ns=5_000),
}


def _bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(obj))


class VirtualClock:
    """Nanoseconds since the epoch, advancing only by the operators' predicted times (and 1 per read, so
    that every stamp is distinct and in call order).

    Args:
        roofline: the device's speed.
        start_ns: the time the clock starts at (default: now, on the wall clock).
    """

    def __init__(self, roofline: Roofline, start_ns: int | None = None) -> None:
        self.roofline = roofline
        self._now = time.time_ns() if start_ns is None else int(start_ns)

    def __call__(self) -> int:
        self._now += 1
        return self._now

    def advance(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Moves the clock past one operator's predicted time."""
        self._now += self.op_ns(func, args, kwargs, out)

    def op_ns(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        """The predicted time of one operator call (a view costs only the fixed overhead)."""
        count = flop_registry.get(getattr(func, "_overloadpacket", None))
        flops = float(count(*args, **kwargs, out_val=out)) if count is not None else 0.0
        moved = 0 if getattr(func, "is_view", False) else _bytes((args, kwargs, out))
        return self.roofline.op_ns(flops, moved)
