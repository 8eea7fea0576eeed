"""Tensors carried across stages (skip connections, an encoder's output): fitting a solver's plan to a budget.

Solvers plan the chain alone; the simulator counts the carried tensors (:mod:`planner.simulation.carried_memory` holds
their rule). :func:`fit` brings a schedule within a budget by asking the solver for a smaller chain budget until
the simulated peak, carried memory included, fits.

The smallest budget that fits (:func:`min_budget_bytes`) is a memory fact, the same however the stages were timed.
The solvers do not see the carried memory, and of the schedules that fit the solver's own minimum, the fastest
(which the measured times choose) may drop a producer's output early and carry its copy longer than another
(a U-Net's minimum moved by 1.4% between two timings of one trace). So the minimum is the lowest carried peak
among the schedules the solver chooses there under :data:`TIMINGS`, fixed stage times that depend only on the
chain's shape; :func:`fit` falls back to those schedules, so every budget from the minimum up is solved. The
measured times may still find a schedule below it (the fastest one at a budget is tried first): on random
chains of 4-9 stages with 1-3 skips, the minimum was within 0.11% on average of the lowest that 40 random
timings found, and at or below it in 99% of them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from planner.errors import InfeasibleBudgetError
from planner.model.carried_tensor import Carried, carried_from_dict
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op
from planner.simulation import carried_memory
from planner.simulation.prediction import Prediction
from planner.simulation.simulator import simulate

if TYPE_CHECKING:
    from planner.solvers.common import Plan

__all__ = ["Carried", "carried_from_dict", "extra_bytes", "fit", "min_budget_bytes", "peak_bytes", "peak_of",
           "timed_as"]

_FIT_TRIES = 8

PlanOn = Callable[[Chain, int], "Plan"]
"""``plan(chain, m)``: the solver's plan for ``chain`` (the chain given, or a copy :func:`timed_as` retimed) at
chain budget ``m``."""


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


def _equal(chain: Chain, stage: int) -> float:
    return 1.0


def _rising(chain: Chain, stage: int) -> float:
    return float(stage)


def _falling(chain: Chain, stage: int) -> float:
    return float(chain.length + 2 - stage)


def _spans(chain: Chain, stage: int, factor: float) -> float:
    inside = any(item.producer < stage < item.consumers[0] for item in chain.carried)
    return factor if inside else 1.0


def _around(chain: Chain, stage: int, offset: int) -> float:
    return 10.0 if any(item.producer + offset == stage for item in chain.carried) else 1.0


TIMINGS: tuple[Callable[[Chain, int], float], ...] = (
    _equal, _rising, _falling, partial(_spans, factor=10.0), partial(_spans, factor=0.1),
    partial(_around, offset=0), partial(_around, offset=1))
"""Stage times (ms, by chain and stage number) the minimum's schedules are chosen under: every stage equal, rising
and falling with position, the stages each carried tensor spans 10x slower and 10x faster, its producer and the
stage after it 10x slower. Each is the forward's, the backward's and every option's recomputation time."""


def timed_as(chain: Chain, timing: Callable[[Chain, int], float]) -> Chain:
    """``chain`` with each stage's times replaced by ``timing`` (one of :data:`TIMINGS`): a solver choosing
    the fastest schedule on it chooses by the chain's bytes and shape alone."""
    def retimed(number: int, stage: Stage) -> Stage:
        ms = timing(chain, number)
        return replace(stage, forward_ms=ms, backward_ms=ms,
                       options=tuple(replace(option, recompute_ms=ms) for option in stage.options))

    return replace(chain, stages=tuple(retimed(n, stage) for n, stage in enumerate(chain.stages, start=1)))


def fit(chain: Chain, budget_bytes: int, plan: PlanOn, min_budget_bytes: Callable[[], int]) -> Plan:
    """A plan whose peak with carried tensors is within ``budget_bytes`` (the chain's own budget).

    ``plan(chain, m)`` solves the chain at chain budget ``m``. The budget asked of it is lowered by the carried
    memory that overshot, a few times; last, the plans at the solver's minimum budget are tried: the fastest,
    then those :func:`min_budget_bytes` measured (:data:`TIMINGS`), one of which fits from the minimum up.

    Raises:
        InfeasibleBudgetError: no plan fits (naming the smallest chain budget that does, see
            :func:`min_budget_bytes`).
    """
    target = budget_bytes
    for _ in range(_FIT_TRIES):
        try:
            candidate = plan(chain, target)
        except InfeasibleBudgetError:
            break
        over = peak_bytes(chain, candidate.ops) - budget_bytes
        if over <= 0:
            return candidate
        target -= over
    floor = min_budget_bytes()
    needed = []
    for solving in (chain, *(timed_as(chain, timing) for timing in TIMINGS)):
        candidate = plan(solving, floor)
        needed.append(peak_bytes(chain, candidate.ops))
        if needed[-1] <= budget_bytes:
            return candidate
    raise InfeasibleBudgetError(
        f"chain budget {budget_bytes} bytes is too small once the tensors carried across stages are counted; "
        f"the smallest is {min(needed[1:])} bytes", budget_bytes=budget_bytes, min_feasible_bytes=min(needed[1:]))


def min_budget_bytes(chain: Chain, plan: PlanOn, solver_min_bytes: int) -> int:
    """The smallest chain budget :func:`fit` succeeds at: the lowest carried peak of the plans the solver chooses
    at its own minimum under :data:`TIMINGS` (a memory fact: the measured times do not move it)."""
    return min(peak_bytes(chain, plan(timed_as(chain, timing), solver_min_bytes).ops) for timing in TIMINGS)
