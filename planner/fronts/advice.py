"""The planner's answer to a failed training step, as lines of text (``memprof report``, the dashboard).

For a chain with step costs every number is the whole training step's memory, what the device has:
store-all's step peak, the least any rotor schedule needs, and the schedule that fits the memory the
failed step had (the failure's budget, else what was allocated when it failed). For a chain without
step costs (the run never completed a step around it) the numbers are the chain's activations beside
the model state the failure recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memprof.categories import MODEL_STATE
from memprof.units import format_bytes
from planner.errors import InfeasibleBudgetError, NotAChainError
from planner.model.chain import Chain
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget

if TYPE_CHECKING:
    from memprof.trace import Trace


def planner_advice(trace: Trace, failure: Mapping[str, Any]) -> list[str]:
    """The planner's answer to a failed step, as report lines (empty reasons are explained, not raised).

    Args:
        trace: the failed run.
        failure: its post-mortem (``trace.meta["failure"]``): ``budget_bytes`` or ``allocated_bytes``
            is the memory the step had, ``categories`` what filled it.

    Returns:
        Lines indented by two spaces, each starting with ``planner:``.
    """
    from planner.discovery.from_trace import chain_from_trace  # pandas: only when there is advice to give

    try:
        chain = chain_from_trace(trace)
    except NotAChainError as exc:
        return [f"  planner: no chain to checkpoint ({exc})"]
    if not any(s.backward_ms > 0 for s in chain.stages[:-1]):
        return ["  planner: the failing step never reached backward, so the chain's backward costs are unknown; "
                "profile a smaller batch to completion, then run memprof plan"]
    limit = failure.get("budget_bytes") or failure.get("allocated_bytes")
    if chain.step is None:
        return _chain_only_advice(trace, chain, failure, limit)
    return _step_advice(trace, chain, int(limit) if limit else None)


def _step_advice(trace: Trace, chain: Chain, limit: int | None) -> list[str]:
    step = chain.step
    assert step is not None, "_step_advice is for chains with step costs"
    needed, least = store_all_budget(chain), min_feasible_budget(chain, "rotor")
    first = (f"  planner: chain of {chain.length} stages in '{chain.name}'; storing all activations, the step peaks "
             f"at {format_bytes(needed)} ({format_bytes(step.base_bytes)} beside the chain: {step.explain_base()}); "
             f"the least a rotor schedule needs is {format_bytes(least)}")
    if least <= step.floor_bytes:
        first += f" ({step.explain_floor()})"
    lines = [first]
    if limit:
        try:
            schedule = solve(chain, limit, algorithm="rotor")
            lines.append(f"  planner: the rotor schedule fits the {format_bytes(limit)} the step had: predicted step "
                         f"peak {format_bytes(schedule.predicted_step_peak_bytes or 0)} (store-all "
                         f"{format_bytes(needed)}), makespan {schedule.predicted_makespan_ms:.1f} ms: "
                         f"memprof plan {trace.path} --budget {limit}")
        except InfeasibleBudgetError as exc:
            lines.append(f"  planner: no schedule fits the {format_bytes(limit)} the step had: {exc}")
    return lines


def _chain_only_advice(trace: Trace, chain: Chain, failure: Mapping[str, Any], limit: int | None) -> list[str]:
    """Advice for a chain without step costs (the run never completed a step around it): activations only."""
    categories = failure.get("categories") or {}
    state = sum(int(categories.get(c.value, 0)) for c in MODEL_STATE)
    needed = store_all_budget(chain)
    lines = [f"  planner: chain of {chain.length} stages in '{chain.name}'; storing all activations needs "
             f"{format_bytes(needed)} on top of {format_bytes(state)} of model state"]
    if limit:
        budget = int(limit) - state
        try:
            schedule = solve(chain, budget, algorithm="rotor")
            lines.append(f"  planner: the rotor schedule fits {format_bytes(budget)} of activations "
                         f"(predicted peak {format_bytes(schedule.predicted_peak_bytes or 0)}, makespan "
                         f"{schedule.predicted_makespan_ms:.1f} ms): memprof plan {trace.path} "
                         f"--activation-budget {budget}")
        except InfeasibleBudgetError as exc:
            lines.append(f"  planner: no schedule fits {format_bytes(max(budget, 0))} of activations: {exc}")
    return lines
