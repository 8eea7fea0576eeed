"""The largest batch that fits a memory, as is and with the planner's schedule, from estimates.

A batch size fits *as is* when its estimated step peak is at most the memory; it fits *with* an algorithm
when the planner, on the chain of the same estimate's trace, has a schedule for the whole step within the
memory (its minimum feasible budget is at most the memory). Both are searched by doubling then bisection
(:func:`largest_fitting`), which assumes the peak grows with the batch. The cost of a schedule is its extra
time: its makespan minus store-all's on the estimate's chain, against the estimate's step time.
Lives in the planner because it joins memprof's estimates and the planner's schedules (memprof must not
import the planner); the ``memprof estimate --max-batch`` command calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memprof.estimation.run import Estimate

__all__ = ["Planned", "largest_fitting", "largest_fitting_reference", "planned_fit"]

#: The largest batch size a search tries.
LIMIT = 1 << 20


def largest_fitting(fits: Callable[[int], bool], start: int = 1, limit: int = LIMIT) -> int | None:
    """The largest ``n`` in ``start..limit`` with ``fits(n)``, for a ``fits`` true up to some size and false
    beyond; ``None`` when ``fits(start)`` is false. Asks ``fits`` about ``2 log2(answer / start)`` times."""
    if start > limit or not fits(start):
        return None
    low, high = start, start * 2
    while high <= limit and fits(high):  # fits(low), and high is the next size to try
        low, high = high, high * 2
    high = min(high, limit + 1)  # fits(low) holds; fits(high) does not (or high is past the limit)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def largest_fitting_reference(fits: Callable[[int], bool], start: int = 1, limit: int = LIMIT) -> int | None:
    """The slow, obvious :func:`largest_fitting`: every size from ``start`` up while they fit."""
    found = None
    for n in range(start, limit + 1):
        if not fits(n):
            break
        found = n
    return found


@dataclass(frozen=True)
class Planned:
    """A schedule that fits the memory, found on an estimate's chain.

    Attributes:
        algorithm: the planner's algorithm.
        peak_bytes: the schedule's predicted step peak.
        extra_ms: its makespan minus store-all's (recomputation).
        step_ms: the estimate's step time (virtual clock), against which ``extra_ms`` is a fraction.
    """

    algorithm: str
    peak_bytes: int
    extra_ms: float
    step_ms: float

    @property
    def slowdown(self) -> float:
        """The step's time with the schedule over its time without, minus one (0.22: +22%)."""
        return self.extra_ms / self.step_ms if self.step_ms > 0 else 0.0


def planned_fit(found: Estimate, memory_bytes: int, algorithm: str) -> Planned | None:
    """The ``algorithm``'s schedule for the estimate's chain within ``memory_bytes``; ``None`` when it has none
    there.

    Raises:
        NotAChainError: the estimate's trace has no chain for the planner.
    """
    from memprof.trace import load_trace
    from planner.discovery.from_trace import chain_from_trace
    from planner.simulation.baseline import store_all_ops
    from planner.simulation.simulator import simulate
    from planner.solvers.dispatch import min_feasible_budget, solve

    trace = load_trace(found.run_dir)
    chain = chain_from_trace(trace)
    if min_feasible_budget(chain, algorithm) > memory_bytes:
        return None
    schedule = solve(chain, memory_bytes, algorithm)
    store_all = simulate(chain, store_all_ops(chain))
    rows = trace.iterations
    step_ms = float(rows[rows.iteration == rows.iteration.max()].step_ms.iloc[0])
    return Planned(algorithm, int(schedule.predicted_step_peak_bytes or schedule.predicted_peak_bytes or 0),
                   float(schedule.predicted_makespan_ms or 0.0) - store_all.makespan_ms, step_ms)
