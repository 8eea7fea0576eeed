"""Tensors carried across stages (skip connections, an encoder's output): what they are and the one rule
for the memory they hold.

A stage may read, besides the running activation ``a^{l-1}``, a tensor made by an earlier stage ``p`` (a
U-Net's encoder output at its level, an encoder's output read by every decoder layer) or before the chain
(a decoder's target embedding). The executor keeps it from the first forward to the backward of its last
reader (the seed's "keep skip tensors as checkpoints") and hands its gradient back through autograd, which
sums it with the gradient the next stage returns, as in plain autograd. The simulator knows nothing of it;
the rule below adds, to the simulator's memory during each operation:

* the tensor's bytes from the first operation that drops the original ``a^p`` (an ``F_none(p+1)`` of the
  forward, a recomputation that replaces it) up to the backward of its first reader, ``B(min consumers)``:
  before the drop the chain itself counts the same storage; after that backward nothing holds it;
* its gradient's bytes after the backward of its last reader, ``B(max consumers)``, up to ``B(p+1)``,
  whose result it is summed into (to the end for a tensor made before the chain and ``grad`` set). During
  ``B(max consumers)`` itself it is part of that stage's measured backward overhead.

A tensor made before the chain (``producer == 0``) is held by the step anyway (``StepCosts.base_bytes``), so
only its gradient counts. Solvers plan the chain alone; :func:`fit` brings a schedule within a budget by
asking the solver for a smaller chain budget until the carried memory fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from planner.carried_tensor import Carried, carried_from_dict
from planner.chain import Chain
from planner.errors import InfeasibleBudgetError
from planner.prediction import Prediction
from planner.schedule import Op, OpKind
from planner.simulator import simulate

if TYPE_CHECKING:
    from planner.solvers.common import Plan

__all__ = ["Carried", "carried_from_dict", "extra_bytes", "fit", "min_budget_bytes", "peak_bytes", "peak_of"]

_FIT_TRIES = 8


def extra_bytes(chain: Chain, prediction: Prediction) -> list[int]:
    """The carried memory during each operation of a simulated schedule (the rule in the module's docstring)."""
    points = prediction.timeline
    extra = [0] * len(points)
    backward = {p.op.stage: p.index for p in points if p.op.kind is OpKind.B}
    for item in chain.carried:
        last_b = backward[item.consumers[0]]
        if item.producer > 0:
            start = _dropped(points, item.producer)
            for index in range(start + 1, last_b + 1):
                extra[index] += item.size_bytes
        if item.grad:
            end = backward.get(item.producer + 1, len(points) - 1) if item.producer > 0 else len(points) - 1
            for index in range(backward[item.consumers[-1]] + 1, end + 1):
                extra[index] += item.size_bytes
    return extra


def _dropped(points: Sequence[Any], stage: int) -> int:
    """The index of the operation after which the chain no longer holds the first forward's ``a^stage``."""
    names = {f"a^{stage}", f"abar^{stage}"}
    first = next(p.index for p in points if p.op.kind.is_forward and p.op.stage == stage)
    for point in points[first + 1 :]:
        if names & set(point.freed) and not point.op.kind.is_transfer:
            return point.index
    return len(points)


def peak_bytes(chain: Chain, ops: Sequence[Op], streamed: Sequence[int] = ()) -> int:
    """The chain's simulated peak with the carried tensors counted (``streamed``: stages streaming weights)."""
    return peak_of(chain, simulate(chain, ops, streamed))


def peak_of(chain: Chain, prediction: Prediction) -> int:
    """The peak of a simulated schedule with the carried tensors counted."""
    extra = extra_bytes(chain, prediction)
    return max([prediction.peak_bytes, *(p.peak_bytes + e for p, e in zip(prediction.timeline, extra))])


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
