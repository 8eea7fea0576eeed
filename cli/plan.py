"""``memprof plan``: a schedule for a memory budget, from a profiled run or a chain file.

Everything is checked before ``--out`` is written, and it is written atomically, so a failed command never
leaves a half-written or overwritten file.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from cli.common import OptionError, load_chain, positive_int, size_option, write_output
from memprof.units import format_bytes
from planner import OpKind, Schedule, StepCosts, TransferCosts
from planner.solvers import held

if TYPE_CHECKING:
    from planner import Chain


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof plan`` to the ``memprof`` command."""
    plan = subparsers.add_parser(
        "plan", help="solve a rematerialization schedule for a memory budget",
        description="Solve a schedule for the chain of a profiled run (or a chain JSON file) under a memory "
                    "budget. For a run (or a chain file with step costs) --budget is the whole training step's "
                    "memory, what the device has: model and optimizer state, batch, activations; "
                    "--activation-budget counts only the chain's activations, their gradients and overheads.",
    )
    plan.add_argument("source", metavar="RUN_DIR_OR_CHAIN_JSON", help="a run directory or a chain JSON file")
    budgets = plan.add_mutually_exclusive_group(required=True)
    budgets.add_argument("--budget", default=None,
                         help="memory of the whole training step (what the device has), e.g. 8GiB, 1.5GB, 4096; "
                              "for a chain file without step costs, the chain's own memory")
    budgets.add_argument("--activation-budget", default=None, metavar="SIZE",
                         help="memory of the chain alone (its activations, their gradients and overheads; the "
                              "ROTOR paper's M), e.g. 512MiB")
    budgets.add_argument("--held-budget", default=None, metavar="SIZE",
                         help="what the forward may hold for the backward (the stages' saved activations, the "
                              "loss's left out: a pipeline stage's stash per micro-batch), e.g. 256MiB; each stage "
                              "keeps one of its recomputation options (runs with op records) and the peak is "
                              "predicted, not bounded")
    plan.add_argument("--algorithm", default=None,
                      help="solver (default rotor; see planner.ALGORITHMS; not with --held-budget)")
    plan.add_argument("--container", default=None,
                      help="run directories only: the module whose children form the chain (default: found)")
    plan.add_argument("--checkpoints", default=None, metavar="A,B,...",
                      help="run directories only: the modules whose outputs are the checkpoints, i.e. the stages, "
                           "comma-separated in the order they run (default: found)")
    plan.add_argument("--recompute-cost", default="time", choices=("time", "flops"),
                      help="run directories with op records only: what weighs a block option's recomputation, the "
                           "ops' recorded times or their FLOPs (as torch.compile's partitioner; default time)")
    plan.add_argument("--selective-overhead-us", default=None, type=_microseconds, metavar="US",
                      help="run directories with op records only: what a selective checkpoint adds per op, paid by "
                           "every block option (default: measured by the planning pass; 0 where large GPU kernels "
                           "hide it)")
    plan.add_argument("--no-loss-options", dest="loss_options", action="store_false",
                      help="run the loss as written: no schedule computes a causal LM's head and cross-entropy in "
                           "chunks (the selective and held-budget solvers' loss options; for a run, the chain is "
                           "also found without them)")
    plan.add_argument("--slots", default=None,
                      help="memory slots of the dynamic programs (default 500; 10000 with --held-budget)")
    plan.add_argument("--host-cap", default=None, metavar="SIZE",
                      help="offload only: the most host memory offloaded activations may take, e.g. 64GiB "
                           "(default: the chain's, else no cap)")
    plan.add_argument("--bandwidth", default=None, metavar="GBPS",
                      help="offload only: device<->host bandwidth in GB/s, both ways (default: the one measured "
                           "with the run, else 24 GB/s, PCIe 4.0 x16)")
    plan.add_argument("--stream-weights", action="store_true",
                      help="also choose stages whose weights, gradients and optimizer state live in host memory and "
                           "are streamed to the device around their computations (chains from a trace)")
    plan.add_argument("--rank", default=None, type=_rank,
                      help="in a torchrun job's folder (rank=<r>/ folders), the rank to plan for (default: the one "
                           "whose peak is highest, which every rank must fit)")
    plan.add_argument("--out", required=True, help="where to write the schedule JSON")
    plan.set_defaults(func=run_plan, reads_runs=True)  # its damage said once (cli.runs)


def run_plan(args: argparse.Namespace) -> int:
    """Solves, checks and writes the schedule, then prints a summary against store-all.

    Raises:
        SizeParseError: the budget is not a byte size.
        OptionError: a bad ``--slots``, ``--container`` or ``--out``.
        MemprofError: an unknown algorithm, an unreadable source, an infeasible budget.
    """
    from planner import DEFAULT_SLOTS, export_json, simulate, solve, solve_held, solver
    from planner.solvers.held import DEFAULT_HELD_SLOTS
    from planner.solvers.store_all import store_all_ops

    activations_only = args.activation_budget is not None
    by_held = args.held_budget is not None
    if by_held and (args.algorithm is not None or getattr(args, "stream_weights", False)):
        raise OptionError("--held-budget picks each stage's recomputation option itself; drop --algorithm and "
                          "--stream-weights, or give --budget instead")
    option, text = (("--held-budget", args.held_budget) if by_held else
                    ("--activation-budget", args.activation_budget) if activations_only else ("--budget", args.budget))
    budget_bytes = size_option(text, option)
    slots = positive_int(args.slots, "--slots") if args.slots is not None else \
        DEFAULT_HELD_SLOTS if by_held else DEFAULT_SLOTS
    algorithm = args.algorithm or "rotor"
    solver(algorithm)  # an unknown name fails before the chain is read
    host_cap = size_option(args.host_cap, "--host-cap") if args.host_cap is not None else None
    gbps = _bandwidth(args.bandwidth)
    checkpoints = [name.strip() for name in args.checkpoints.split(",")] if args.checkpoints else None
    rank = _job_rank(args.source, getattr(args, "rank", None))
    chain = _with_link(load_chain(args.source, args.container, checkpoints, args.recompute_cost,
                                  args.selective_overhead_us, getattr(args, "loss_options", True), rank), host_cap, gbps)
    step = chain.step
    solved = chain.activations_only() if activations_only else chain
    if by_held:
        schedule = solve_held(solved, budget_bytes, slots)
    else:
        schedule = solve(solved, budget_bytes, algorithm=algorithm, slots=slots,
                         stream_weights=bool(getattr(args, "stream_weights", False)))
    prediction = simulate(solved, schedule)  # the one judge: carried tensors and streamed weights counted
    schedule = schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms, prediction.host_peak_bytes)
    baseline = simulate(solved, store_all_ops(solved))
    out = write_output(args.out, export_json(schedule) + "\n")
    print(summary(schedule, baseline.peak_bytes, baseline.makespan_ms, out, step=step))
    return 0


def _rank(text: str) -> int:
    try:
        rank = int(text)
    except ValueError:
        rank = -1
    if rank < 0:
        raise argparse.ArgumentTypeError(f"expected a rank, a whole number from 0, found {text!r}")
    return rank


def _job_rank(source: str, rank: int | None) -> int | None:
    """The rank planned for when ``source`` is a torchrun job's folder (said in a line), else ``rank`` unchanged.

    Raises:
        OptionError: ``--rank`` with a run or chain file that is not a job's folder.
        TraceNotFoundError: the job has no such rank.
    """
    from memprof.trace import job_ranks, rank_to_open

    ranks = sorted(job_ranks(source))
    if not ranks:
        if rank is not None:
            raise OptionError(f"--rank chooses a rank of a torchrun job's folder (rank=<r>/ folders), but {source} "
                              "is one run; drop --rank")
        return None
    chosen, _ = rank_to_open(source, rank)
    why = "as asked" if rank is not None else "the highest peak: every rank must fit it"
    print(f"planning for rank {chosen} of ranks {', '.join(map(str, ranks))} ({why}; --rank R for another)")
    return chosen


def summary(schedule: Schedule, store_all_peak_bytes: int, store_all_makespan_ms: float, out: Path,
            step: StepCosts | None = None) -> str:
    """A few lines: algorithm, budget, predicted peaks and makespan against store-all, recomputations.

    Args:
        schedule: the schedule, with its prediction.
        store_all_peak_bytes: store-all's simulated peak of the chain (chain-only, the paper's M).
        store_all_makespan_ms: store-all's makespan.
        out: where the schedule was written.
        step: the step costs of the chain it was made for (defaults to the schedule chain's); with them the
            whole step's predicted peak is printed beside the chain's.
    """
    step = step if step is not None else schedule.chain.step
    whole_step = schedule.chain.step is not None  # the budget was the whole step's
    peak = int(schedule.predicted_peak_bytes or 0)
    makespan = float(schedule.predicted_makespan_ms or 0.0)
    forwards = sum(op.kind.is_forward for op in schedule.ops)
    recomputations = forwards - (schedule.chain.length + 1)
    if schedule.budget_bytes is None:
        budget = "none"
    elif schedule.algorithm == held.NAME:
        budget = (f"{format_bytes(schedule.budget_bytes)} held for the backward (the stages' saved activations; "
                  f"the peak is predicted, not bounded)")
    elif whole_step and step is not None:
        budget = (f"{format_bytes(schedule.budget_bytes)} for the whole step (leaves the chain "
                  f"{format_bytes(max(step.chain_budget_bytes(schedule.budget_bytes), 0))})")
    else:
        budget = f"{format_bytes(schedule.budget_bytes)} for the chain only (activations, their gradients, overheads)"
    lines = [
        f"{schedule.algorithm} schedule for chain {schedule.chain.name!r} ({schedule.chain.length} stages + loss)",
        f"  budget           {budget}",
    ]
    if step is not None:
        step_store_all = step.step_peak_bytes(store_all_peak_bytes)
        # a schedule streaming weights moves state off the device: its own step peak says so
        step_peak = schedule.predicted_step_peak_bytes if schedule.streamed_weights and \
            schedule.predicted_step_peak_bytes is not None else step.step_peak_bytes(peak)
        lines += [
            f"  step peak        {format_bytes(step_peak)} predicted for the whole step (store-all "
            f"{format_bytes(step_store_all)}, {_change(step_peak, step_store_all)})",
            f"  beside chain     {format_bytes(step.base_bytes)} ({step.explain_base()}); "
            f"no schedule goes below {format_bytes(step.floor_bytes)}",
        ]
    label = "chain peak      " if step is not None else "predicted peak  "
    lines += [
        f"  {label} {format_bytes(peak)} (store-all {format_bytes(store_all_peak_bytes)}, "
        f"{_change(peak, store_all_peak_bytes)})",
        f"  makespan         {makespan:.3f} ms (store-all {store_all_makespan_ms:.3f} ms, "
        f"{_change(makespan, store_all_makespan_ms)})",
        f"  operations       {len(schedule.ops)} ({recomputations} recomputed forwards)",
    ]
    if schedule.algorithm == held.NAME:
        kept, full = schedule.params.held_bytes or 0, held.store_all_held_bytes(schedule.chain)
        chosen = sum(1 for k in schedule.params.options or () if k)
        lines.append(f"  held             {format_bytes(kept)} for the backward (store-all {format_bytes(full)}, "
                     f"{_change(kept, full)}); {chosen} of {schedule.chain.length} stages keep less than everything")
    if schedule.algorithm == "offload" or schedule.has_transfers:
        offloaded = sorted({op.stage for op in schedule.ops if op.kind is OpKind.OFFLOAD})
        host = int(schedule.predicted_host_peak_bytes or 0)
        lines.append(f"  offloaded        {len(offloaded)} stages {offloaded} to host memory: host peak "
                     f"{format_bytes(host)} (link {schedule.chain.transfer_costs.describe()})")
    if schedule.streamed_weights:
        streamed = list(schedule.streamed_weights)
        lines.append(f"  streamed weights {len(streamed)} stages {streamed} live in host memory (parameters, gradients, "
                     f"optimizer state); host peak {format_bytes(int(schedule.predicted_host_peak_bytes or 0))}")
    if schedule.chain.source.get("compiled"):
        lines.append("  compiled         costed as the compiled model runs (each block a compiled region): "
                     "apply_schedule runs its stages compiled too")
    lines.append(f"wrote {out}")
    return "\n".join(lines)


def _bandwidth(text: str | None) -> float | None:
    """``--bandwidth`` in GB/s.

    Raises:
        OptionError: not a number > 0.
    """
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"--bandwidth must be a number of GB/s > 0, e.g. 24, found {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise OptionError(f"--bandwidth must be a number of GB/s > 0, e.g. 24, found {text!r}")
    return value


def _with_link(chain: Chain, host_cap: int | None, gbps: float | None) -> Chain:
    """``chain`` with the link the options give (each option replacing its part of the chain's own)."""
    if host_cap is None and gbps is None:
        return chain
    link = chain.transfer_costs
    if gbps is not None:
        link = TransferCosts.from_gbps(gbps, gbps, link.host_cap_bytes, "given")
    if host_cap is not None:
        link = replace(link, host_cap_bytes=host_cap)
    return chain.with_transfer(link)


def _change(value: float, reference: float) -> str:
    if reference == 0:
        return "n/a"
    return f"{(value - reference) / reference:+.1%}"


def _microseconds(text: str) -> float:
    """``--selective-overhead-us``: a number of microseconds >= 0 (a usage error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds >= 0, e.g. 15, found {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds >= 0, e.g. 15, found {text!r}")
    return value
