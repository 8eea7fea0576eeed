"""How much the layers' recorded times are scaled by before they become the chain's stage times.

The ``layers`` table times each module between the hooks' marks of a hooked iteration, on the host's clock
(:mod:`memprof.analysis.phase_times`). The hooks slow the forward down (each submodule call runs the profiler's
Python, a few times the forward of a small block), and on CUDA the host's clock runs ahead of the kernels, so
that a chain costed from those times predicts recomputation as dearer than it is and the step's time wrongly.
The run's phase times say by how much: each iteration's forward and backward, between the root's marks, on the
device's clock. The forward and the backward times of every stage are scaled by

    median forward of the basis iterations (device's clock) / median forward of the costed ones (host's clock)

(the backward likewise), where the basis is the run's steady iterations (the submodules' hooks off: close to
the step without a profiler) or, in a run that had none, the costed iterations themselves (on a CPU the scale
is then 1; on CUDA it turns the host's clock into the device's). The scale is uniform over the stages: the
hooks' cost is spread over the modules roughly as their calls are, so the share of each stage is kept.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memprof.analysis.phase_times import PhaseTime, phase_times_from_meta
from memprof.trace import Trace

__all__ = ["BASES", "NO_SCALE", "TimeScale", "time_scale", "time_scale_from"]

#: What a scale was measured against: the steady iterations, the costed iterations' device clock, or nothing.
BASES = ("steady", "hooked", "none")


@dataclass(frozen=True)
class TimeScale:
    """The factors the stages' forward and backward times are multiplied by.

    Attributes:
        forward: the forward times' factor.
        backward: the backward times' factor.
        basis: one of :data:`BASES`.
        clock: the clock the basis was measured with (``"host"`` or ``"cuda"``).
        iterations: how many basis iterations the factors are medians over.
    """

    forward: float = 1.0
    backward: float = 1.0
    basis: str = "none"
    clock: str = "host"
    iterations: int = 0

    def __post_init__(self) -> None:
        for name in ("forward", "backward"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"a time scale's {name} factor must be a finite number > 0, found {value!r}")
        if self.basis not in BASES:
            raise ValueError(f"a time scale's basis must be one of {BASES}, found {self.basis!r}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, as the chain's ``source`` shows it (:meth:`from_json` reads it)."""
        return {**asdict(self), "forward": round(self.forward, 4), "backward": round(self.backward, 4)}

    @staticmethod
    def from_json(data: Mapping[str, Any] | None) -> TimeScale:
        """The scale a chain's ``source["time_scale"]`` holds; :data:`NO_SCALE` for ``None`` (a chain built
        before times were scaled, or by hand).

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not what :meth:`to_json` writes.
        """
        if data is None:
            return NO_SCALE
        return TimeScale(forward=float(data["forward"]), backward=float(data["backward"]), basis=str(data["basis"]),
                         clock=str(data["clock"]), iterations=int(data["iterations"]))

    def describe(self) -> str:
        """The scale in words, for a report or the dashboard."""
        if self.basis == "none":
            return "layer times as recorded"
        basis = (f"{self.iterations} steady iterations (hooks off)" if self.basis == "steady"
                 else f"the device's clock ({self.clock})")
        return f"layer times scaled to {basis}: forward x{self.forward:.2f}, backward x{self.backward:.2f}"


#: The times as recorded.
NO_SCALE = TimeScale()


def time_scale_from(times: Sequence[PhaseTime], costed: Sequence[int], clock: str = "host") -> TimeScale:
    """The scale for layer times that are medians over the ``costed`` iterations, given the run's phase times.

    :data:`NO_SCALE` when no costed iteration has phase times, or a median is zero.
    """
    wanted = set(costed)
    hooked = [t for t in times if t.iteration in wanted and not t.steady]
    if not hooked:
        return NO_SCALE
    steady = [t for t in times if t.steady]
    basis, name = (steady, "steady") if steady else (hooked, "hooked")
    factors = []
    for device, host in (("forward_ms", "host_forward_ms"), ("backward_ms", "host_backward_ms")):
        measured = statistics.median(getattr(t, device) for t in basis)
        recorded = statistics.median(getattr(t, host) for t in hooked)
        if not (measured > 0 and recorded > 0):
            return NO_SCALE
        factors.append(measured / recorded)
    return TimeScale(forward=factors[0], backward=factors[1], basis=name, clock=clock, iterations=len(basis))


def time_scale(trace: Trace, costed: Sequence[int]) -> TimeScale:
    """:func:`time_scale_from` with the phase times of ``trace``'s ``meta.json``.

    Raises:
        memprof.errors.CorruptTraceError: ``meta.json``'s ``phase_times`` is malformed.
    """
    clock, times = phase_times_from_meta(trace.meta)
    return time_scale_from(times, costed, clock)
