"""Each iteration's forward and backward time, on the host's clock and on the device's.

The per-layer times of the ``layers`` table are measured between the hooks' marks of a hooked iteration, on
the host's clock. Two things keep them from being the training step's own times: the hooks themselves (in a
hooked iteration the forward runs up to a few times slower than in a steady one, where the submodules' hooks
are off: :mod:`memprof.capture.steady`), and, on CUDA, the host running ahead of the kernels it launched. The
profiler therefore also times each iteration's forward (the model's outermost call, the last one when it
accumulated gradients) and the backward after it, between the root module's marks, which every iteration
keeps: on the host's clock, and on CUDA between CUDA events recorded at the same marks (the device's clock;
on a CPU the two are the same). ``meta.json`` keeps the latest ones under ``phase_times``; the planner scales
the layers' times by them (:mod:`planner.discovery.time_scale`). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memprof.errors import CorruptTraceError

__all__ = ["CLOCKS", "META_KEY", "PhaseTime", "phase_times_from_meta", "phase_times_to_meta"]

#: ``meta.json``'s key.
META_KEY = "phase_times"
#: The device clocks a run's phase times are measured with.
CLOCKS = ("host", "cuda")


@dataclass(frozen=True)
class PhaseTime:
    """One iteration's forward and backward time.

    Attributes:
        iteration: the iteration.
        steady: whether the submodules' hooks were off (a steady iteration: close to the step without a profiler).
        host_forward_ms: the forward, on the host's clock (what the layers' times add up to in a hooked iteration).
        host_backward_ms: the backward after it (from the forward's end to the backward's), on the host's clock.
        forward_ms: the forward on the device's clock (the host's on a CPU).
        backward_ms: the backward on the device's clock.
    """

    iteration: int
    steady: bool
    host_forward_ms: float
    host_backward_ms: float
    forward_ms: float
    backward_ms: float

    def __post_init__(self) -> None:
        if isinstance(self.iteration, bool) or not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(f"a phase time's iteration must be a whole number >= 0, found {self.iteration!r}")
        if not isinstance(self.steady, bool):
            raise ValueError(f"a phase time's steady must be True or False, found {self.steady!r}")
        for name in ("host_forward_ms", "host_backward_ms", "forward_ms", "backward_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"a phase time's {name} must be a finite number >= 0, found {value!r}")


def phase_times_to_meta(clock: str, times: Sequence[PhaseTime]) -> dict[str, Any]:
    """``meta.json``'s ``phase_times`` value for ``times`` measured with ``clock`` (one of :data:`CLOCKS`)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, found {clock!r}")
    rows = [{"iteration": t.iteration, "steady": t.steady, "host_forward_ms": round(t.host_forward_ms, 4),
             "host_backward_ms": round(t.host_backward_ms, 4), "forward_ms": round(t.forward_ms, 4),
             "backward_ms": round(t.backward_ms, 4)} for t in sorted(times, key=lambda t: t.iteration)]
    return {"clock": clock, "iterations": rows}


def phase_times_from_meta(meta: Mapping[str, Any]) -> tuple[str, tuple[PhaseTime, ...]]:
    """The clock and the phase times a run's ``meta.json`` holds; ``("host", ())`` when it holds none (a run
    recorded before they were measured, an estimate).

    Raises:
        CorruptTraceError: ``phase_times`` is there but is not what :func:`phase_times_to_meta` writes.
    """
    raw = meta.get(META_KEY)
    if raw is None:
        return "host", ()
    try:
        clock = raw["clock"]
        if clock not in CLOCKS:
            raise ValueError(f"unknown clock {clock!r}")
        times = tuple(PhaseTime(**{**row, "iteration": int(row["iteration"])}) for row in raw["iterations"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptTraceError(f"meta.json's {META_KEY} is not a list of iterations' phase times ({exc}); "
                                f"remove the key to plan from the layers' own times") from None
    return clock, times
