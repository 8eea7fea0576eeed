"""Tensors carried across stages (skip connections, an encoder's output): fitting a solver's plan to a budget.

Solvers plan the chain alone; the simulator counts the carried tensors (:mod:`planner.simulation.carried_memory` holds
their rule). :func:`fit` brings a schedule within a budget by asking the solver for a smaller chain budget until
the simulated peak, carried memory included, fits.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from planner.errors import InfeasibleBudgetError
from planner.model.carried_tensor import Carried, carried_from_dict
from planner.model.chain import Chain
from planner.model.schedule import Op
from planner.simulation import carried_memory
from planner.simulation.prediction import Prediction
from planner.simulation.simulator import simulate

if TYPE_CHECKING:
    from planner.solvers.common import Plan

__all__ = ["Carried", "carried_from_dict", "extra_bytes", "fit", "min_budget_bytes", "peak_bytes", "peak_of"]

_FIT_TRIES = 8


def peak_bytes(chain: Chain, ops: Sequence[Op], streamed: Sequence[int] = ()) -> int:
    """The chain's simulated peak, carried tensors counted (``streamed``: stages streaming weights)."""
    return simulate(chain, ops, streamed).peak_bytes


def extra_bytes(chain: Chain, prediction: Prediction) -> list[int]:
    """The carried memory during each operation of a simulated schedule
    (:func:`planner.simulation.carried_memory.extra_bytes` on its timeline; the simulator has added it already)."""
    return carried_memory.extra_bytes(chain, prediction.timeline)


def peak_of(chain: Chain, prediction: Prediction) -> int:
    """Deprecated: ``simulate`` counts the carried tensors itself; read ``prediction.peak_bytes``."""
    warnings.warn("planner.solvers.carried_fit.peak_of is deprecated: simulate() counts the carried tensors itself, so "
                  "prediction.peak_bytes is the peak (peak_of would now return it unchanged)", DeprecationWarning,
                  stacklevel=2)
    return prediction.peak_bytes


def fit(chain: Chain, budget_bytes: int, plan: Callable[[int], Plan], min_budget_bytes: Callable[[], int]) -> Plan:
    """A plan whose peak with carried tensors is within ``budget_bytes`` (the chain's own budget).

    ``plan(m)`` solves the chain at chain budget ``m``. The budget asked of it is lowered by the carried
    memory that overshot, a few times; last, the plan at the solver's minimum budget is tried.

    Raises:
        InfeasibleBudgetError: no plan fits (naming the smallest chain budget that does, see
            :func:`min_budget_bytes`).
    """
    target = budget_bytes
    for _ in range(_FIT_TRIES):
        try:
            candidate = plan(target)
        except InfeasibleBudgetError:
            break
        over = peak_bytes(chain, candidate.ops) - budget_bytes
        if over <= 0:
            return candidate
        target -= over
    floor = min_budget_bytes()
    candidate = plan(floor)
    needed = peak_bytes(chain, candidate.ops)
    if needed <= budget_bytes:
        return candidate
    raise InfeasibleBudgetError(
        f"chain budget {budget_bytes} bytes is too small once the tensors carried across stages are counted; "
        f"the smallest is {needed} bytes", budget_bytes=budget_bytes, min_feasible_bytes=needed)


def min_budget_bytes(chain: Chain, plan: Callable[[int], Plan], solver_min_bytes: int) -> int:
    """The smallest chain budget :func:`fit` succeeds at: the carried peak of the plan at the solver's minimum."""
    return peak_bytes(chain, plan(solver_min_bytes).ops)
