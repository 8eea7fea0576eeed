"""``memprof profile-ops MODULE:FACTORY --batch-size N``: a planning pass, the aten ops of one training step.

``FACTORY(batch_size)`` returns ``(model, batch, loss_fn)`` (see :mod:`cli.factory`) on a real device. The
command runs ``--warmup`` training steps and then one more under ``MemoryProfiler(..., ops=True)``, so the run
written under ``--out`` holds the usual tables and the ``ops`` table of that last step; it prints, per module,
the ops recorded, the bytes autograd saved of them, their forward time and FLOPs.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.common import OptionError, positive_int, whole_number
from cli.estimate import OPTIMIZERS, optimizer_factory
from cli.factory import build, load_factory
from memprof.analysis.op_records import OpRecord
from memprof.errors import MemprofError
from memprof.units import format_bytes

__all__ = ["ModuleOps", "StepError", "module_ops", "register", "run_profile_ops"]


class StepError(MemprofError):
    """The user's training step raised, or never called the model."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof profile-ops`` to the ``memprof`` command."""
    parser = subparsers.add_parser(
        "profile-ops", help="record the aten ops of one training step (the planner's op-level costs)",
        description="Run --warmup training steps of FACTORY(batch_size) -> (model, batch, loss_fn), then one "
                    "more recording its forward's aten ops (new output bytes, what autograd saves of them, time, "
                    "FLOPs) into the trace's ops table; print a summary per module.")
    parser.add_argument("factory", metavar="MODULE:FACTORY",
                        help="a module name or .py file, a colon, a function taking the batch size")
    parser.add_argument("--batch-size", required=True, help="the batch size")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                        help="sgd (momentum 0.9), adam, adamw (default) or none (forward and backward only)")
    parser.add_argument("--warmup", type=whole_number(0), default=1,
                        help="training steps before the recorded one (default 1)")
    parser.add_argument("--out", default="traces", help="folder for the trace (default traces)")
    parser.add_argument("--run-id", default=None, help="name of the run (default: model class and time)")
    parser.add_argument("--top", type=whole_number(0), default=20,
                        help="how many modules to list, most bytes saved first (default 20; 0: all)")
    parser.add_argument("--compile-baseline", action="store_true",
                        help="also measure torch.compile's min-cut partitioner at activation_memory_budget 1.0, 0.5, "
                             "0.3, 0.1 (step peak, FLOPs, step time) and store it beside the run for the dashboard's "
                             "Pareto view (compiles the model four times: minutes on large models)")
    parser.set_defaults(func=run_profile_ops)


@dataclass(frozen=True)
class ModuleOps:
    """The ops one module ran itself (not its children's), summed.

    Attributes:
        module: qualified name (``""``: the root, and ops outside every module).
        ops: how many ops.
        saved_bytes: bytes of the outputs of its ops that some op's backward needs.
        forward_ms: their summed wall time.
        flops: their summed FLOPs.
    """

    module: str
    ops: int
    saved_bytes: int
    forward_ms: float
    flops: int


def module_ops(records: Sequence[OpRecord]) -> list[ModuleOps]:
    """Sums the records per module, in the order modules first ran an op."""
    needed = {i for record in records for i in record.needs}
    totals: dict[str, list[Any]] = {}
    for record in records:
        row = totals.setdefault(record.module, [0, 0, 0.0, 0])
        row[0] += 1
        row[1] += record.output_bytes if record.index in needed else 0
        row[2] += record.forward_ms
        row[3] += record.flops
    return [ModuleOps(name, *row) for name, row in totals.items()]


def run_profile_ops(args: argparse.Namespace) -> int:
    """Runs the steps, writes the trace and prints the summary.

    Raises:
        FactoryError: MODULE:FACTORY cannot be loaded, or the factory failed.
        StepError: the step raised, or its forward never ran through the model.
        OptionError: a bad option, or a model on the meta device.
        ProfilerError: ``--out``/``--run-id`` already holds a trace.
    """
    batch_size = positive_int(args.batch_size, "--batch-size")
    model, batch, loss_fn = build(load_factory(args.factory), args.factory, batch_size)
    if not hasattr(model, "parameters") or not callable(getattr(model, "train", None)):
        raise StepError(f"{args.factory}({batch_size}) returned a {type(model).__name__} as the model; "
                        "expected a torch.nn.Module")
    devices = {p.device.type for p in model.parameters()}
    if "meta" in devices:
        raise OptionError(f"the model of {args.factory} is on the meta device: profile-ops runs the step for real "
                          "(build it on cpu or cuda; memprof estimate takes meta models)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a failed step is reported as one line: the profiler's warnings about it would only repeat it
        run_dir, records = _record(args, model, batch, loss_fn, "cuda" if "cuda" in devices else "cpu")
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    from memprof import load_trace

    overhead_us = load_trace(run_dir).meta.get("selective_overhead_us_per_op")
    print(summary(records, run_dir, args.factory, batch_size, args.warmup, args.top, overhead_us))
    if args.compile_baseline:
        print(_compile_baseline(model, batch, loss_fn, args.optimizer, run_dir), flush=True)
    return 0


def _compile_baseline(model: Any, batch: Any, loss_fn: Any, optimizer_name: str, run_dir: Path) -> str:
    from planner import COMPILE_BUDGETS, measure_compile, write_compile_points

    print(f"measuring torch.compile at activation_memory_budget {', '.join(map(str, COMPILE_BUDGETS))} ...",
          flush=True)
    device = next(model.parameters()).device.type
    make = optimizer_factory(optimizer_name, device)
    optimizer = make(list(model.parameters())) if make is not None else None
    try:
        points = measure_compile(model, lambda compiled: loss_fn(compiled, batch), optimizer)
    except MemprofError:
        raise
    except Exception as exc:  # torch.compile could not compile or run the step: one line, as bad input
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StepError(f"torch.compile failed on the step: {type(exc).__name__}: {text}") from None
    path = write_compile_points(run_dir, points)
    lines = [f"torch.compile (min-cut partitioner), written to {path}:"]
    for p in points:
        lines.append(f"  budget {p.activation_memory_budget:<4} step peak {format_bytes(p.step_peak_bytes):>11}  "
                     f"held {format_bytes(p.held_bytes):>11}  {p.flops / 1e9:9.3f} GFLOP  {p.step_ms:9.1f} ms")
    return "\n".join(lines)


def _record(args: argparse.Namespace, model: Any, batch: Any, loss_fn: Any, device: str) -> tuple[Path, list[OpRecord]]:
    from memprof import MemoryProfiler, load_trace

    make = optimizer_factory(args.optimizer, device)
    optimizer = make(list(model.parameters())) if make is not None else None
    model.train()
    profiler = MemoryProfiler(model, optimizer, out_dir=args.out, run_id=args.run_id, print_period=0,
                              background=False, ops=True, ops_iteration=args.warmup)
    with profiler:
        for step in range(args.warmup + 1):
            try:
                loss = loss_fn(model, batch)
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            except MemprofError:
                raise
            except Exception as exc:  # the user's model or loss raised: one line, as bad input
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise StepError(f"step {step} of {args.factory} raised {type(exc).__name__}: {text}") from None
            del loss
            profiler.record_stats()
    records = load_trace(profiler.run_dir).op_records(args.warmup)
    if not records:
        raise StepError(f"no op was recorded: the loss_fn of {args.factory} did not call the model it was given "
                        "(its forward must run through model(...), so its module hooks fire)")
    return profiler.run_dir, records


def summary(records: Sequence[OpRecord], run_dir: Path, spec: str, batch_size: int, warmup: int, top: int,
            overhead_us: float | None = None) -> str:
    """The per-module table of a planning pass, most bytes saved first (``overhead_us``: what the pass measured
    a selective checkpoint to add per op)."""
    rows = module_ops(records)
    shown = sorted(rows, key=lambda r: (-r.saved_bytes, -r.forward_ms))[: top or None]
    width = max([len(r.module or "(root)") for r in shown] + [6])
    lines = [f"ops of {spec} at batch {batch_size}, step {warmup} (after {warmup} warm-up): {len(records)} ops "
             f"in {len(rows)} modules, {format_bytes(sum(r.saved_bytes for r in rows))} saved for backward, "
             f"{sum(r.forward_ms for r in rows):.2f} ms, {sum(r.flops for r in rows):,} FLOPs",
             f"  {'module':<{width}}  {'ops':>5}  {'saved':>10}  {'forward':>10}  {'FLOPs':>14}"]
    lines += [f"  {(r.module or '(root)'):<{width}}  {r.ops:>5}  {format_bytes(r.saved_bytes):>10}  "
              f"{r.forward_ms:>7.3f} ms  {r.flops:>14,}" for r in shown]
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more modules (--top 0 lists all)")
    if overhead_us is not None:
        lines.append(f"  a selective checkpoint adds {overhead_us:.1f} us per op here: every recomputation option "
                     "pays it on each op of its block (memprof plan --selective-overhead-us overrides it)")
    lines.append(f"  trace {run_dir} (Trace.op_records() reads the ops back)")
    return "\n".join(lines)
