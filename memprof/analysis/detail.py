"""Which iterations keep their detail (the ``layers`` and ``events`` rows) and which only their summary row.

Every iteration gets its row in ``iterations`` (step time, peak, categories at the peak): it is cheap and what
an overview of a long run plots. The detail of a 100-layer model is ~100 times larger, and users look at a few
iterations: the first ones, the worst one, the one before a crash, the ones they ask for. A
:class:`DetailPolicy` names them. Torch-free: the background worker applies it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memprof.errors import ProfilerError

#: Defaults: a 100,000-iteration run of a 100-layer model stays under ~100 MiB (docs/benchmarks.md).
DEFAULT_FIRST = 10
DEFAULT_EVERY = 200
DEFAULT_PEAK_RISE = 0.01


@dataclass(frozen=True)
class DetailPolicy:
    """The iterations whose detail a trace keeps.

    An iteration keeps its detail when any of these holds: it is one of the ``first`` iterations; its number
    is a multiple of ``every``; its peak exceeds the highest peak of every detailed iteration before it by
    more than ``peak_rise`` (a fraction), so the run's highest peak is always within ``peak_rise`` of a
    detailed iteration's; it failed (out of memory, the budget guard) or is the last iteration before one
    that failed; the user asked for it (``record_stats(detail=True)``).

    Attributes:
        first: iterations 0 .. first-1 keep their detail.
        every: every this many iterations keep their detail (0: none but the others above; 1: all).
        peak_rise: how far above the highest detailed peak a new peak must rise to keep its detail.
    """

    first: int = DEFAULT_FIRST
    every: int = DEFAULT_EVERY
    peak_rise: float = DEFAULT_PEAK_RISE

    def __post_init__(self) -> None:
        for name in ("first", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ProfilerError(f"detail_{name} must be a whole number >= 0, found {value!r}")
        rise = self.peak_rise
        if isinstance(rise, bool) or not isinstance(rise, (int, float)) or not 0 <= rise < float("inf"):
            raise ProfilerError(f"detail_peak_rise must be a fraction >= 0 (0.01: 1%), found {rise!r}")

    @staticmethod
    def everything() -> DetailPolicy:
        """Detail for every iteration (what a short run or a benchmark of one step wants)."""
        return DetailPolicy(first=0, every=1)

    def scheduled(self, iteration: int) -> bool:
        """Whether ``iteration`` keeps its detail by number alone (first ones, every n-th)."""
        return iteration < self.first or (self.every > 0 and iteration % self.every == 0)

    def new_peak(self, peak_bytes: int, detailed_peak_bytes: int) -> bool:
        """Whether a peak rises far enough above the highest detailed one to keep its detail."""
        return peak_bytes > detailed_peak_bytes * (1.0 + self.peak_rise)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (see :meth:`from_json`); also what ``meta.json`` shows."""
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> DetailPolicy:
        """Rebuilds a policy written by :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError, ProfilerError: the dict is not such a policy.
        """
        return DetailPolicy(first=int(data["first"]), every=int(data["every"]), peak_rise=float(data["peak_rise"]))
