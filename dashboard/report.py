"""``memprof report``: a run's summary in the terminal, and for a failed run the post-mortem with
the planner's answer in whole-step memory (what the step needs, which schedule fits the memory it had)."""

from __future__ import annotations

import argparse
from typing import Any

from memprof.analysis.console import format_failure, format_report
from memprof.categories import MODEL_STATE
from memprof.trace.reader import Trace, load_trace
from memprof.units import format_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof report`` to the ``memprof`` command."""
    parser = subparsers.add_parser("report", help="print a run's memory summary (its peak iteration)")
    parser.add_argument("run_dir", help="a run directory written by MemoryProfiler")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to show (default: the peak one)")
    parser.add_argument("--top", type=int, default=10, help="how many layers to list")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Prints the report of one iteration of a run."""
    trace = load_trace(args.run_dir)
    iterations = trace.iterations
    if iterations.empty:
        print(f"run {trace.run_id}: no iteration recorded yet (status {trace.meta.get('status')})")
        return 0
    if args.iteration is None:
        row = iterations.loc[iterations.peak_allocated_bytes.idxmax()]
    else:
        chosen = iterations[iterations.iteration == args.iteration]
        if chosen.empty:
            from memprof.errors import TraceError

            raise TraceError(f"run {trace.run_id} has no iteration {args.iteration}; it has "
                             f"{int(iterations.iteration.min())}..{int(iterations.iteration.max())}")
        row = chosen.iloc[0]
    layers = trace.layers
    layers = layers[layers.iteration == row.iteration]
    print(f"run {trace.run_id} | model {trace.meta['model']} | {len(iterations)} iterations")
    print(format_report(row.to_dict(), layers.to_dict("records"), trace.meta["device"], top=args.top))
    if trace.meta.get("failure"):
        print(format_failure(trace.meta["failure"]))
        print("\n".join(planner_advice(trace, trace.meta["failure"])))
    return 0


def planner_advice(trace: Trace, failure: dict) -> list[str]:
    """The planner's answer to a failed step, as report lines (empty reasons are explained, not raised).

    For a chain with step costs every number is the whole training step's memory, what the device has:
    store-all's step peak, the least any rotor schedule needs, and the schedule that fits the memory the
    failed step had (the failure's budget, else what was allocated when it failed).
    """
    from planner import NotAChainError, chain_from_trace

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


def _step_advice(trace: Trace, chain: Any, limit: int | None) -> list[str]:
    from planner import InfeasibleBudgetError, min_feasible_budget, solve, store_all_budget

    step = chain.step
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


def _chain_only_advice(trace: Trace, chain: Any, failure: dict, limit: int | None) -> list[str]:
    """Advice for a chain without step costs (the run never completed a step around it): activations only."""
    from planner import InfeasibleBudgetError, solve, store_all_budget

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
