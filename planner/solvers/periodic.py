"""PyTorch's ``checkpoint_sequential`` with k segments, every k tried, the fastest one that fits kept.

``checkpoint_sequential(functions, k, x)`` takes ``size = L // k``; the first ``k - 1`` segments of ``size``
stages each run under ``checkpoint`` -- their forward runs without recording and keeps only the segment's
input, i.e. ``F_ck(first) F_none(first+1) .. F_none(last)`` -- and the last segment (the remaining
``L - (k-1) * size`` stages) runs normally, recorded, followed by the loss. Backward goes through the last
segment and the loss directly; on reaching each checkpointed segment, from the last to the first, it
re-runs the segment's forward with recording (``F_all``) and back-propagates through it (``B``).
``k = 1`` is store-all.
"""

from __future__ import annotations

from planner.model.chain import Chain
from planner.model.schedule import Op
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import predict
from planner.solvers.common import Plan, infeasible, segmented_ops


def periodic_ops(chain: Chain, segments: int) -> tuple[Op, ...]:
    """The operations ``checkpoint_sequential`` runs with ``segments`` segments (1 <= segments <= L).

    Raises:
        ValueError: ``segments`` is outside 1..L (PyTorch itself fails for more segments than stages).
    """
    length = chain.length
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= length:
        raise ValueError(f"segments must be a whole number in 1..{length} (the chain's stages), found {segments!r}")
    size = length // segments
    bounds = [(start + 1, start + size) for start in range(0, size * (segments - 1), size)]
    return segmented_ops(length, bounds)


def candidates(chain: Chain) -> list[tuple[int, int, float]]:
    """``(segments, peak_bytes, makespan_ms)`` for every segment count 1..L."""
    out = []
    for segments in range(1, chain.length + 1):
        peak, makespan = predict(chain, periodic_ops(chain, segments))
        out.append((segments, peak, makespan))
    return out


def min_budget_bytes(chain: Chain, slots: int = 0) -> int:
    """The smallest peak over all segment counts (``slots`` is unused)."""
    return min(peak for _, peak, _ in candidates(chain))


def plan(chain: Chain, budget_bytes: int, slots: int = 0) -> Plan:
    """The fastest segment count whose peak fits ``budget_bytes`` (fewest segments on a tie).

    Raises:
        InfeasibleBudgetError: no segment count fits.
    """
    options = candidates(chain)
    feasible = [(makespan, segments) for segments, peak, makespan in options if peak <= budget_bytes]
    if not feasible:
        raise infeasible("periodic", budget_bytes, min(peak for _, peak, _ in options))
    _, segments = min(feasible)
    return Plan(periodic_ops(chain, segments), ScheduleParams(segments=segments, segment_size=chain.length // segments))
