"""``memprof report RUN_DIR``: a run's summary in the terminal, and for a failed run the post-mortem with
the planner's answer in whole-step memory (what the step needs, which schedule fits the memory it had)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.common import whole_number
from memprof.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof report`` to the ``memprof`` command."""
    parser = subparsers.add_parser("report", help="print a run's memory summary (its peak iteration)")
    parser.add_argument("run_dir", help="a run directory written by MemoryProfiler")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to show (default: the peak one)")
    parser.add_argument("--top", type=whole_number(0), default=10, help="how many layers to list (default 10)")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Prints the report of one iteration of a run.

    Raises:
        TraceError: the run cannot be read, or it has no such iteration.
    """
    from memprof.analysis import format_failure, format_report  # the reader needs pandas: only when run
    from memprof.trace import load_trace
    from planner.advice import planner_advice

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
            raise TraceError(f"run {trace.run_id} has no iteration {args.iteration}; it has "
                             f"{int(iterations.iteration.min())}..{int(iterations.iteration.max())}")
        row = chosen.iloc[0]
    layers = trace.read("layers", iterations=[int(row.iteration)])
    detailed = trace.detail_iterations
    print(f"run {trace.run_id} | model {trace.meta['model']} | {len(iterations)} iterations, "
          f"{len(detailed)} with detail")
    print(format_report(row.to_dict(), layers.to_dict("records"), trace.meta["device"], top=args.top))
    if layers.empty and detailed:
        print(_no_detail_note(iterations, detailed, int(row.iteration)))
    if trace.meta.get("failure"):
        print(format_failure(trace.meta["failure"]))
        print("\n".join(planner_advice(trace, trace.meta["failure"])))
    return 0


def _no_detail_note(iterations: pd.DataFrame, detailed: list[int], iteration: int) -> str:
    """Where to look when the shown iteration kept only its summary row."""
    peaks = iterations.set_index("iteration").peak_allocated_bytes
    highest = max(detailed, key=lambda i: (int(peaks.get(i, 0)), -i))
    nearest = min(detailed, key=lambda i: (abs(i - iteration), i))
    return (f"iteration {iteration} kept its summary only (the detail policy in meta.json); the layers of "
            f"iteration {nearest} (the nearest with detail) or {highest} (the highest detailed peak) are shown "
            f"with --iteration")
