"""``memprof report RUN_DIR``: a run's summary in the terminal, and for a failed run the post-mortem with
the planner's answer in whole-step memory (what the step needs, which schedule fits the memory it had)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cli.common import whole_number
from cli.runs import open_run, state_lines
from memprof.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd

    from memprof.trace import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof report`` to the ``memprof`` command."""
    parser = subparsers.add_parser("report", help="print a run's memory summary (its peak iteration; every rank's "
                                   "peak for a distributed run)")
    parser.add_argument("run_dir", help="a run directory written by MemoryProfiler (or a distributed run's, holding "
                                        "rank=<r>/ folders)")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to show (default: the peak one)")
    parser.add_argument("--top", type=whole_number(0), default=10, help="how many layers to list (default 10)")
    parser.set_defaults(func=run_report, reads_runs=True)  # its damage said once (cli.runs)


def run_report(args: argparse.Namespace) -> int:
    """Prints the report of one iteration of a run; an interrupted or still running run first says so, and
    which iterations are complete (:func:`cli.runs.state_lines`).

    Raises:
        TraceError: the run cannot be read, or it has no such iteration.
    """
    from memprof.analysis import format_failure, format_report  # the reader needs pandas: only when run
    from memprof.trace.ranks import rank_dirs
    from planner import planner_advice

    if not (Path(args.run_dir) / "meta.json").exists() and rank_dirs(args.run_dir):
        return run_rank_report(args)
    trace = open_run(args.run_dir)  # every part read: a damaged one anywhere is said (cli.runs)
    iterations = trace.iterations
    for line in state_lines(trace):  # an interrupted or live run says so before its numbers
        print(line)
    if iterations.empty:
        what = "is readable (see the warning)" if trace.damage else "recorded yet"
        print(f"run {trace.run_id}: no iteration {what} (status {trace.state})")
        return 0
    if args.iteration is None:  # a compiled run's costing iterations never headline it
        pool = trace.headline_iterations
        row = pool.loc[pool.peak_allocated_bytes.idxmax()]
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
    if trace.costing_iterations:
        print(_costing_note(trace, int(row.iteration)))
    print(format_report(_with_notes(trace, row), layers.to_dict("records"), trace.meta["device"], top=args.top))
    if layers.empty and detailed:
        print(_no_detail_note(iterations, trace.costing_iterations or detailed, int(row.iteration)))
    if trace.meta.get("failure"):
        print(format_failure(trace.meta["failure"]))
        print("\n".join(planner_advice(trace, trace.meta["failure"])))
    return 0


def run_rank_report(args: argparse.Namespace) -> int:
    """Prints a distributed run's ranks side by side: each rank's peak, the imbalance, the worst rank's breakdown.

    Raises:
        TraceError: a rank's trace cannot be read.
    """
    from memprof.analysis import format_report
    from memprof.trace import load_trace
    from memprof.trace.ranks import peak_imbalance, rank_dirs, rank_summary
    from memprof.units import format_bytes

    summary = rank_summary(args.run_dir)
    imbalance = peak_imbalance(summary)
    run = Path(args.run_dir)
    if imbalance is None:
        print(f"run {run.name}: {len(rank_dirs(run))} ranks, no iteration recorded yet")
        return 0
    worst = load_trace(run / f"rank={imbalance.highest_rank}")
    print(f"run {run.name} | model {worst.meta['model']} | {len(summary)} ranks "
          f"(world size {worst.meta.get('world_size', len(summary))})")
    for state_line in _rank_states(run, summary):
        print(state_line)
    rows = [[str(int(r.rank)), format_bytes(int(r.peak_allocated_bytes)), str(int(r.peak_iteration)),
             str(r.peak_phase), str(r.peak_module) or "-", str(int(r.iterations))] for r in summary.itertuples()]
    headers = ["rank", "peak allocated", "at iteration", "phase", "module", "iterations"]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    print(f"imbalance: rank {imbalance.highest_rank} peaks at "
          f"{format_bytes(imbalance.peak_by_rank_bytes[imbalance.highest_rank])}, {imbalance.ratio:.2f}x rank "
          f"{imbalance.lowest_rank}'s {format_bytes(imbalance.peak_by_rank_bytes[imbalance.lowest_rank])} "
          f"({format_bytes(imbalance.spread_bytes)} more); every rank needs the highest")
    iterations = worst.iterations
    row = iterations.loc[iterations.peak_allocated_bytes.idxmax()]
    layers = worst.read("layers", iterations=[int(row.iteration)])
    print(f"\nthe highest rank, {imbalance.highest_rank} (memprof report {run / f'rank={imbalance.highest_rank}'} "
          "for its details):")
    print(format_report(_with_notes(worst, row), layers.to_dict("records"), worst.meta["device"], top=args.top))
    return 0


def _with_notes(trace: Trace, row: pd.Series) -> dict:
    """The iterations row with what the training console said of its peak (the loss span, the previous step's
    gradients alive there), read back from its detail (:func:`memprof.trace.peak_notes.peak_notes`)."""
    from memprof.trace.peak_notes import peak_notes

    return {**row.to_dict(), **peak_notes(trace, int(row.iteration))}


def _rank_states(run: Path, summary: pd.DataFrame) -> list[str]:
    """One line per rank that was interrupted or is still running (from its ``meta.json`` alone)."""
    from memprof.trace.listing import read_meta
    from memprof.trace.liveness import INTERRUPTED, RUNNING, run_state
    from memprof.trace.ranks import rank_dirs

    counts = dict(zip(summary["rank"].astype(int), summary.iterations.astype(int)))
    said = {INTERRUPTED: "was INTERRUPTED (its process ended without closing it)", RUNNING: "is still RUNNING"}
    lines = []
    for rank, path in rank_dirs(run):
        state = run_state(read_meta(path))
        if state in said:
            lines.append(f"rank {rank} {said[state]}: its {counts.get(rank, 0)} complete iterations are shown")
    return lines


def _costing_note(trace: Trace, shown: int) -> str:
    """What a compiled run's costing iterations are, and whether the shown iteration is one."""
    costing = trace.costing_iterations
    how = ("compiled with each repeated block a region of its own, marked around" if trace.meta.get(
        "regional_iterations") else "eagerly (torch.compiler.set_stance('force_eager'))")
    listed = ", ".join(str(i) for i in costing)
    what = ("this is one of them, not the compiled model as it runs" if shown in costing
            else f"iteration {shown} is shown, as the compiled model runs")
    return (f"compiled model: iteration(s) {listed} are costing iterations, run {how} for the layers and the "
            f"planner's chain; {what}")


def _no_detail_note(iterations: pd.DataFrame, detailed: list[int], iteration: int) -> str:
    """Where to look when the shown iteration kept only its summary row."""
    peaks = iterations.set_index("iteration").peak_allocated_bytes
    highest = max(detailed, key=lambda i: (int(peaks.get(i, 0)), -i))
    nearest = min(detailed, key=lambda i: (abs(i - iteration), i))
    return (f"iteration {iteration} kept its summary only (the detail policy in meta.json); the layers of "
            f"iteration {nearest} (the nearest with detail) or {highest} (the highest detailed peak) are shown "
            f"with --iteration")
