"""Which stages stream their weights from host memory, chosen with the activation schedule, for a budget.

For a set S of streamed stages the step changes in two ways (:mod:`planner.model.weights`,
:mod:`planner.simulation.weight_streams`): the device's resident model state loses S's parameters, optimizer state
(and gradients held from before the step), and every computation on a stage of S holds its parameters,
the next streamed stage's arriving ones and a gradient leaving, at most
``WeightCosts.transient_bound_bytes(S)``. So for a whole-step budget ``M``, the activation schedule is
solved by the chosen activation algorithm (rotor, offload, ...) at the chain budget

    M - base(S) - transient_bound(S)

(with the host cap lowered by what S holds on the host), and the simulator replays it with S streamed:
its peak is within ``M`` by construction, its makespan includes every wait for a weight copy.

The fast search (:func:`plan`) tries O(L) sets (:func:`nested_sets`): the stages ordered by how well their
copies hide behind the computations they overlap (:func:`stream_order`) and each prefix of that order, then
every k-th stage for k = 2..4 (each offset) and each prefix of those; the fastest feasible one wins (ties:
fewer streamed stages -- no copies where none are needed -- then the lower peak).
``reference/weight_plan.py`` tries every subset on small chains; the tests hold the fast search to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from memprof.units import format_bytes
from planner.errors import ChainError, InfeasibleBudgetError
from planner.model.chain import Chain
from planner.model.schedule import Op
from planner.model.schedule_params import ScheduleParams
from planner.model.weights import WeightCosts, streamed_step
from planner.simulation.simulator import simulate
from planner.solvers import carried_fit as carried
from planner.solvers.common import Plan
from planner.solvers.registry import Solver


@dataclass(frozen=True)
class Streamed:
    """One choice of streamed stages with its activation schedule and the simulator's prediction.

    Attributes:
        streamed: the stages whose weights are streamed (sorted).
        ops: the activation schedule.
        params: the activation solver's parameters.
        peak_bytes: the chain's simulated peak with the streamed weights (and carried tensors) counted.
        makespan_ms: the simulated makespan, every copy's wait included.
        host_peak_bytes: host memory at its peak (offloaded activations and streamed weights' state).
        step_peak_bytes: the whole step's predicted peak (``None`` for a chain without step costs).
        algorithm: the activation algorithm that ran (differs from the one asked for after a fallback).
    """

    streamed: tuple[int, ...]
    ops: tuple[Op, ...]
    params: ScheduleParams
    peak_bytes: int
    makespan_ms: float
    host_peak_bytes: int
    step_peak_bytes: int | None
    algorithm: str | None = None

    @property
    def device_bytes(self) -> int:
        """What a budget is compared with: the step's peak, or the chain's for a hand-written chain."""
        return self.step_peak_bytes if self.step_peak_bytes is not None else self.peak_bytes


def weights_of(chain: Chain) -> WeightCosts:
    """The chain's weight costs.

    Raises:
        ChainError: the chain has none (say how to get them).
    """
    if chain.weights is None:
        raise ChainError(f"chain {chain.name!r} has no weight costs, so no stage can stream its weights; build it "
                         "from a trace (planner.chain_from_trace) or set chain.weights (planner.model.weights.WeightCosts)")
    return chain.weights


def stream_order(chain: Chain) -> list[int]:
    """Stages 1..L ordered for streaming: least time lost first, then most device memory saved.

    A stage's loss is what its copies take beyond the computations they overlap: W_l in beside ``F(l-1)``
    and beside ``B(l+1)``, G_l out beside ``B(l-1)``.
    """
    weights, link = weights_of(chain), chain.transfer_costs
    top = chain.length + 1

    def lost_ms(stage: int) -> float:
        forward_before = chain.stage(stage - 1).forward_ms if stage > 1 else 0.0
        backward_before = chain.stage(stage + 1).backward_ms if stage + 1 <= top else 0.0
        backward_after = chain.stage(stage - 1).backward_ms if stage > 1 else 0.0
        into = link.h2d_ms(weights.params(stage))
        return (max(0.0, into - forward_before) + max(0.0, into - backward_before)
                + max(0.0, link.d2h_ms(weights.grads(stage)) - backward_after))

    return sorted(range(1, chain.length + 1), key=lambda s: (lost_ms(s), -weights.resident_bytes(s), s))


STRIDES = (2, 3, 4)
"""The fast search also tries every ``k``-th stage (each offset) for these ``k``: a streamed stage's copy
overlaps every computation since the previous streamed run, so spacing them hides copies longer than a stage."""


def nested_sets(chain: Chain) -> list[tuple[int, ...]]:
    """The sets the fast search tries: every prefix of :func:`stream_order` (the empty one first), then
    the strided sets (:data:`STRIDES`) and every prefix of each in the same order."""
    order = stream_order(chain)
    sets = [tuple(sorted(order[:k])) for k in range(len(order) + 1)]
    for stride in STRIDES:
        for offset in range(1, min(stride, chain.length) + 1):
            chosen = set(range(offset, chain.length + 1, stride))
            ranked = [s for s in order if s in chosen]
            sets += [tuple(sorted(ranked[:k])) for k in range(1, len(ranked) + 1)]
    return list(dict.fromkeys(sets))


def _streaming_chain(chain: Chain, streamed: Sequence[int]) -> Chain | None:
    """The chain the activation solver sees: the host cap lowered by the streamed state (``None``: no room)."""
    link = chain.transfer_costs
    if link.host_cap_bytes is None or not streamed:
        return chain
    left = link.host_cap_bytes - weights_of(chain).host_bytes(streamed)
    return None if left < 0 else chain.with_transfer(replace(link, host_cap_bytes=left))


def _bound(chain: Chain, streamed: Sequence[int]) -> int:
    if not streamed:
        return 0
    return weights_of(chain).transient_bound_bytes(streamed, [s.weight_grad_bytes for s in chain.stages[:-1]])


def _inner_budget(chain: Chain, budget_bytes: int, streamed: Sequence[int]) -> int | None:
    """The activation solver's chain budget for ``streamed`` (``None``: below the step's floor)."""
    step = streamed_step(chain, streamed)
    bound = _bound(chain, streamed)
    if step is None:
        return budget_bytes - bound
    if budget_bytes < step.floor_bytes:
        return None
    return step.chain_budget_bytes(budget_bytes) - bound


def _activation_plan(chain: Chain, module: Solver, inner: int, slots: int) -> Plan:
    if chain.carried:
        return carried.fit(chain, inner, lambda c, m: module.plan(c, m, slots),
                           lambda: int(module.min_budget_bytes(chain, slots)))
    return module.plan(chain, inner, slots)


def evaluate(chain: Chain, budget_bytes: int, module: Solver, streamed: Iterable[int],
             slots: int) -> Streamed | None:
    """``streamed`` with the activation schedule of ``module`` within ``budget_bytes``; ``None`` if none fits."""
    chosen = tuple(sorted(streamed))
    solving = _streaming_chain(chain, chosen)
    inner = _inner_budget(chain, budget_bytes, chosen)
    if solving is None or inner is None:
        return None
    try:
        found = _activation_plan(solving, module, inner, slots)
    except InfeasibleBudgetError:
        return None
    prediction = simulate(chain, found.ops, chosen)
    peak = carried.peak_bytes(chain, found.ops, chosen) if chain.carried else prediction.peak_bytes
    step = streamed_step(chain, chosen)
    step_peak = step.step_peak_bytes(peak) if step is not None else None
    result = Streamed(chosen, found.ops, found.params, peak, prediction.makespan_ms,
                      prediction.host_peak_bytes, step_peak, found.algorithm)
    if result.device_bytes > budget_bytes:
        raise AssertionError(f"streaming {list(chosen)} peaks at {result.device_bytes} bytes over the budget "
                             f"{budget_bytes}: the transient bound does not hold")
    return result


def min_budget_for(chain: Chain, module: Solver, streamed: Sequence[int], slots: int) -> int | None:
    """The smallest budget :func:`evaluate` succeeds at with ``streamed`` (``None``: none, host cap too small)."""
    chosen = tuple(sorted(streamed))
    solving = _streaming_chain(chain, chosen)
    if solving is None:
        return None
    try:
        inner = int(module.min_budget_bytes(solving, slots))
        if chain.carried:
            inner = carried.min_budget_bytes(solving, lambda c, m: module.plan(c, m, slots), inner)
    except InfeasibleBudgetError:
        return None
    bound = _bound(chain, chosen)
    step = streamed_step(chain, chosen)
    if step is None:
        return inner + bound
    return max(step.floor_bytes, inner + bound + step.base_bytes)


def best_of(chain: Chain, budget_bytes: int, module: Solver, sets: Iterable[Sequence[int]],
            slots: int, algorithm: str) -> Streamed:
    """The fastest feasible choice among ``sets`` (ties: fewer streamed stages, then the lower device peak).

    Raises:
        InfeasibleBudgetError: none fits; the message names the smallest budget at which one does.
    """
    tried = [tuple(s) for s in sets]
    found = [r for r in (evaluate(chain, budget_bytes, module, s, slots) for s in tried) if r is not None]
    if found:
        return min(found, key=lambda r: (r.makespan_ms, len(r.streamed), r.device_bytes))
    minima = [m for m in (min_budget_for(chain, module, s, slots) for s in tried) if m is not None]
    least = min(minima) if minima else None
    named = "none (the host cap is too small for any choice)" if least is None else \
        f"{format_bytes(least)} ({least} bytes)"
    raise InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} ({budget_bytes} bytes) is too small for {algorithm} with weight "
        f"streaming: no set of streamed stages the search tries fits the step in it; the smallest budget is "
        f"{named}", budget_bytes=budget_bytes, min_feasible_bytes=least)


def plan(chain: Chain, budget_bytes: int, module: Solver, slots: int, algorithm: str) -> Streamed:
    """The fast search: the fastest of :func:`nested_sets` within ``budget_bytes``.

    Raises:
        ChainError: the chain has no weight costs.
        InfeasibleBudgetError: no set fits (naming the smallest budget that works).
    """
    weights_of(chain)
    return best_of(chain, budget_bytes, module, nested_sets(chain), slots, algorithm)


def min_budget_bytes(chain: Chain, module: Solver, slots: int) -> int:
    """The smallest budget :func:`plan` succeeds at (over its nested sets).

    Raises:
        InfeasibleBudgetError: no set works at any budget (the host cap is too small).
    """
    minima = [m for m in (min_budget_for(chain, module, s, slots) for s in nested_sets(chain)) if m is not None]
    if not minima:
        raise InfeasibleBudgetError("no choice of streamed stages fits the host cap", budget_bytes=0,
                                    min_feasible_bytes=None)
    return min(minima)
