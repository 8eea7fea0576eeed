"""``memprof report``: a run's summary in the terminal, and for a failed run the post-mortem with
the planner's answer (what budget the step needs, which schedule fits the memory it had)."""

from __future__ import annotations

import argparse

from memprof.categories import MODEL_STATE
from memprof.reader import Trace, load_trace
from memprof.report import format_failure, format_report
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
    """The planner's answer to a failed step, as report lines (empty reasons are explained, not raised)."""
    from planner import Chain, InfeasibleBudgetError, NotAChainError, solve, store_all_budget

    try:
        chain = Chain.from_trace(trace)
    except NotAChainError as exc:
        return [f"  planner: no chain to checkpoint ({exc})"]
    if not any(s.backward_ms > 0 for s in chain.stages[:-1]):
        return ["  planner: the failing step never reached backward, so the chain's backward costs are unknown; "
                "profile a smaller batch to completion, then run memprof plan"]
    categories = failure.get("categories") or {}
    state = sum(int(categories.get(c.value, 0)) for c in MODEL_STATE)
    needed = store_all_budget(chain)
    lines = [f"  planner: chain of {chain.length} stages in '{chain.name}'; storing all activations needs "
             f"{format_bytes(needed)} on top of {format_bytes(state)} of model state"]
    limit = failure.get("budget_bytes") or failure.get("allocated_bytes")
    if limit:
        budget = int(limit) - state
        try:
            schedule = solve(chain, budget, algorithm="rotor")
            lines.append(f"  planner: the rotor schedule fits {format_bytes(budget)} of activations "
                         f"(predicted peak {format_bytes(schedule.predicted_peak_bytes or 0)}, makespan "
                         f"{schedule.predicted_makespan_ms:.1f} ms): memprof plan {trace.path} --budget {budget}")
        except InfeasibleBudgetError as exc:
            lines.append(f"  planner: no schedule fits {format_bytes(max(budget, 0))} of activations: {exc}")
    return lines
