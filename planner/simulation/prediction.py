"""What the simulator predicts for one schedule: a point per operation, the peaks and the makespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.model.schedule import Op

if TYPE_CHECKING:
    import pandas as pd

FRAME_COLUMNS = ("index", "kind", "stage", "start_ms", "end_ms", "memory_bytes", "peak_bytes", "live", "stream",
                 "host_bytes")


@dataclass(frozen=True)
class TimelinePoint:
    """One operation of a replayed schedule.

    Attributes:
        index: position of the operation in the schedule (0-based).
        op: the operation.
        start_ms: when it starts, counted from the start of the schedule (a transfer: its copy's start).
        end_ms: when it ends (a transfer: its copy's end, which may lie after later operations started).
        memory_bytes: device memory held after it.
        peak_bytes: device memory during it, its output and overhead included.
        added: names of the values it added to device memory (e.g. ``("abar^3",)``), retired copies included.
        freed: names of the values it freed.
        stream: ``"compute"``, or ``"d2h"`` / ``"h2d"`` for an offload / a prefetch.
        host_bytes: host memory held by offloaded activations after it.
    """

    index: int
    op: Op
    start_ms: float
    end_ms: float
    memory_bytes: int
    peak_bytes: int
    added: tuple[str, ...] = ()
    freed: tuple[str, ...] = ()
    stream: str = "compute"
    host_bytes: int = 0


@dataclass(frozen=True)
class Prediction:
    """The simulator's prediction for one schedule.

    Attributes:
        peak_bytes: the largest device memory during any operation (Definition 3.4).
        makespan_ms: when the last operation ends: the operations' durations plus every wait for a copy
            (Definition 3.2 when nothing is offloaded).
        timeline: one point per operation.
        start_live: names of the values held before the first operation.
        host_peak_bytes: the most host memory offloaded activations held at once (0 without transfers).
    """

    peak_bytes: int
    makespan_ms: float
    timeline: tuple[TimelinePoint, ...]
    start_live: tuple[str, ...] = ()
    host_peak_bytes: int = 0

    def live(self) -> tuple[tuple[str, ...], ...]:
        """For each operation, the names of the values held after it (by index, gradient last)."""
        held = set(self.start_live)
        out = []
        for point in self.timeline:
            held.difference_update(point.freed)
            held.update(point.added)
            out.append(tuple(sorted(held, key=_name_order)))
        return tuple(out)

    def to_frame(self) -> pd.DataFrame:
        """The timeline as a table with columns ``FRAME_COLUMNS`` (``live`` joins the held values' names)."""
        import pandas as pd  # only for this table: solving and simulating stay pandas-free

        rows = [
            (p.index, p.op.kind.value, p.op.stage, p.start_ms, p.end_ms, p.memory_bytes, p.peak_bytes, " ".join(live),
             p.stream, p.host_bytes)
            for p, live in zip(self.timeline, self.live())
        ]
        return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))


def _name_order(name: str) -> tuple[int, int]:
    kind, index = name.split("^")
    return (1 if kind == "delta" else 0, int(index))
