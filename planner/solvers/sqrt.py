"""Chen et al. (2016), "Training deep nets with sublinear memory cost": a checkpoint every sqrt(L) stages.

The chain is cut after every ``round(sqrt(L))`` stages; during the forward pass only each segment's input
is kept (``F_ck(first) F_none(..) ..``), and during the backward pass each segment is re-run with
recording and back-propagated, from the last segment to the first. The last segment (the stages after
the last checkpoint, plus the loss) is recorded directly, as no implementation would re-run a segment
right after running it. One schedule, independent of the budget.
"""

from __future__ import annotations

import math

from planner.model.chain import Chain
from planner.model.schedule import Op
from planner.model.schedule_params import ScheduleParams
from planner.simulation.simulator import predict
from planner.solvers.common import Plan, infeasible, segmented_ops


def segment_length(chain: Chain) -> int:
    """``round(sqrt(L))``, at least 1."""
    return max(1, round(math.sqrt(chain.length)))


def sqrt_ops(chain: Chain) -> tuple[Op, ...]:
    """The sqrt(L) schedule."""
    length, size = chain.length, segment_length(chain)
    starts = list(range(1, length + 1, size))
    bounds = [(first, min(first + size - 1, length)) for first in starts[:-1]]
    return segmented_ops(length, bounds)


def min_budget_bytes(chain: Chain, slots: int = 0) -> int:
    """The schedule's simulated peak (``slots`` is unused)."""
    return predict(chain, sqrt_ops(chain))[0]


def plan(chain: Chain, budget_bytes: int, slots: int = 0) -> Plan:
    """The sqrt(L) schedule, when its peak fits ``budget_bytes``.

    Raises:
        InfeasibleBudgetError: its peak is above the budget.
    """
    ops = sqrt_ops(chain)
    peak = predict(chain, ops)[0]
    if budget_bytes < peak:
        raise infeasible("sqrt", budget_bytes, peak)
    size = segment_length(chain)
    return Plan(ops, ScheduleParams(segment_length=size, segments=-(-chain.length // size)))
