"""The loss stage's options in a persistent DP: the best schedule over them.

In every persistent schedule the loss runs once, ``F_all(L+1)`` immediately followed by ``B(L+1)``, and
nothing else happens in between; its option (e.g. the head and cross-entropy in ``k`` chunks,
:mod:`planner.discovery.loss_options`) changes only what the loss holds while it runs, its transients and
the time ``B(L+1)`` takes. So it enters the DP's recurrence in one place, the base case ``C(L+1, L+1, m)``,
and the optimum over the loss's options is

    min over k of  C_k(1, L+1, M),

``C_k`` being the DP of the chain whose loss stage has option ``k``'s costs (:func:`variant`): the same value
a base case taking the minimum over the options would give, computed by the DPs that exist. The schedule
then records ``F_all(L+1)`` with the option chosen, and the simulator prices it with the option's own rule
(:mod:`planner.simulation.memory_rules`), identical to the variant's store-all rule for the loss (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.solvers.common import Plan, infeasible

__all__ = ["chunk_choices", "has_loss_options", "min_budget_bytes", "plan", "variant", "with_loss_option"]


def chunk_choices(chain: Chain) -> tuple[int, ...]:
    """The loss stage's choices: 0 (as profiled) and each of its chunked-loss options.

    Other options a hand-written loss stage may list (a selective option, which recomputes what it dropped
    before the backward) cannot lower anything when ``B(L+1)`` follows ``F_all(L+1)``: they are not choices.
    """
    options = chain.stages[-1].options
    return (0, *(k for k, option in enumerate(options, start=1) if option.chunks))


def has_loss_options(chain: Chain) -> bool:
    """Whether the loss stage offers a chunked loss."""
    return len(chunk_choices(chain)) > 1


def variant(chain: Chain, option: int) -> Chain:
    """``chain`` whose loss stage is its option ``option`` made plain: option 0 is ``chain`` without the loss's
    options; a chunked option ``k`` holds a-bar_k, has the option's overheads and adds its recomputation to
    ``B`` (it regrows nothing before the backward: :meth:`~planner.model.chain.Stage.regrown_with`).
    Every persistent schedule's memory is then the same on both chains, operation by operation, except
    right after an eager option's ``F_all(L+1)``."""
    loss = chain.stages[-1]
    if option == 0:
        plain = replace(loss, options=())
    else:
        chosen = loss.options[option - 1]
        # An eager option's a-bar_k holds B's results (delta^L, the parameter gradients), which B hands over:
        # as a plain stage, they are part of its forward's transient and of what its B allocates. Only the
        # memory between F_all(L+1) and B(L+1) differs, where a persistent schedule runs nothing.
        handed = chain.stages[-2].grad_bytes + loss.weight_grad_bytes if chosen.eager else 0
        plain = replace(loss, saved_bytes=chosen.saved_bytes - handed,
                        backward_ms=loss.backward_ms + chosen.recompute_ms,
                        forward_overhead_bytes=loss.forward_overhead_with(option) + handed,
                        backward_overhead_bytes=loss.backward_overhead_with(option), options=())
    return replace(chain, stages=(*chain.stages[:-1], plain))


def with_loss_option(ops: tuple[Op, ...], top: int, option: int) -> tuple[Op, ...]:
    """``ops`` with every ``F_all(top)`` recording the loss's ``option``."""
    return tuple(Op(OpKind.F_ALL, top, option) if op.kind is OpKind.F_ALL and op.stage == top else op for op in ops)


def plan(name: str, chain: Chain, budget_bytes: int, plan_fixed: Callable[[Chain, int], Plan],
         min_fixed: Callable[[Chain], int], makespan: Callable[[Chain, tuple[Op, ...]], float]) -> Plan:
    """The fastest of ``plan_fixed``'s plans over the loss's options (ties: the option listed first).

    Args:
        name: the algorithm, for the error.
        chain: the chain, its loss stage with options.
        budget_bytes: the chain's budget.
        plan_fixed: the DP on a chain whose loss has no options.
        min_fixed: its minimum feasible budget on such a chain.
        makespan: the judge's makespan of operations on a chain (the simulator's).

    Raises:
        InfeasibleBudgetError: no option has a schedule within the budget (the lowest minimum is named).
    """
    best: tuple[float, int, Plan] | None = None
    for option in chunk_choices(chain):
        fixed = variant(chain, option)
        try:
            found = plan_fixed(fixed, budget_bytes)
        except InfeasibleBudgetError:
            continue
        ops = with_loss_option(found.ops, chain.length + 1, option)
        time_ms = makespan(chain, ops)
        if best is None or time_ms < best[0]:
            best = (time_ms, option, replace(found, ops=ops))
    if best is None:
        raise infeasible(name, budget_bytes, min_budget_bytes(chain, min_fixed), "over the loss stage's options")
    return best[2]


def min_budget_bytes(chain: Chain, min_fixed: Callable[[Chain], int]) -> int:
    """The lowest of ``min_fixed`` over the loss's options.

    Only the variants no other one holds less than in every respect are solved (what the loss keeps, its
    forward and backward transients): a minimum budget depends on memory alone and grows with each of them,
    so more chunks of the same kind (smaller transients, the same a-bar_k) always reach at least as low.
    """
    variants = [variant(chain, option) for option in chunk_choices(chain)]
    costs = [_memory(fixed) for fixed in variants]
    kept = [fixed for index, fixed in enumerate(variants)
            if not any(_covers(other, costs[index]) and (other != costs[index] or earlier < index)
                       for earlier, other in enumerate(costs) if earlier != index)]
    return min(min_fixed(fixed) for fixed in kept)


def _memory(fixed: Chain) -> tuple[int, int, int]:
    loss = fixed.stages[-1]
    return loss.saved_bytes, loss.forward_overhead_bytes, loss.backward_overhead_bytes


def _covers(low: tuple[int, ...], high: tuple[int, ...]) -> bool:
    return all(a <= b for a, b in zip(low, high))
