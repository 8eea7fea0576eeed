"""``memprof demo``: the whole loop on embedded models - profile, plan, execute and measure, serve.

On a 2-core CPU it finishes in a few minutes: three models (a ResNet-style CNN with BatchNorm, a GPT-style
transformer stack and a Hugging Face-style Llama whose forward loops over its blocks with keyword side
inputs), trained with Adam: first each step's memory is estimated on fake tensors (``memprof.estimate``),
then a few iterations of each are profiled and the measured peak printed beside the estimate; the chain is found automatically; every
algorithm at several whole-step budgets; store-all and a selection of schedules executed and measured
(whole-step peak predicted against measured); one hand-written chain of 3,000 small stages solved by
binomial checkpointing; then the dashboard.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cli.common import port_number, require_dashboard_extra, whole_number
from dashboard.server import DEFAULT_HOST, DEFAULT_PORT, check_can_listen, serve
from memprof.units import format_bytes

# torch, the example models and the planner load when the demo runs, not when `memprof --help` is built.
if TYPE_CHECKING:
    import torch

    from examples.zoo import ModelAndData
    from memprof import Estimate
    from planner import Comparison, Schedule

# fractions of the way from the minimum feasible budget to store-all's peak (whole-step budgets)
BUDGET_FRACTIONS = (0.0, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class DemoModel:
    """An embedded model, its batch size and the container holding its chain."""

    name: str
    builder: str  # a function of examples.zoo
    options: dict[str, int]
    batch_size: int
    container: str | None

    def build(self) -> ModelAndData:
        """The model and its batch maker, from :mod:`examples.zoo`."""
        from examples import zoo

        make: Callable[..., ModelAndData] = getattr(zoo, self.builder)
        return make(**self.options)


DEMO_MODELS = (
    DemoModel("resnet", "cnn", {"channels": 32, "blocks": 6, "image": 32}, 16, None),
    DemoModel("gpt", "transformer", {"vocab": 512, "dim": 128, "heads": 4, "layers": 6, "seq": 64}, 8, None),
    DemoModel("llama", "llama", {"vocab": 512, "dim": 128, "heads": 4, "kv_heads": 2, "layers": 6, "seq": 64}, 8,
              None),
)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Adam, for the profiled and the measured runs alike: the whole step's peak counts its state and step."""
    import torch

    return torch.optim.Adam(model.parameters(), lr=1e-3)


class Progress:
    """A one-line progress bar on stderr (no dependency; degrades to lines when not a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.start = time.perf_counter()
        self._tty = sys.stderr.isatty()

    def step(self, note: str = "") -> None:
        """Advances the bar by one."""
        self.done += 1
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        line = f"{self.label:<28} [{bar}] {self.done}/{self.total} {time.perf_counter() - self.start:5.1f}s {note}"
        if self._tty:
            end = "\n" if self.done >= self.total else ""
            print("\r" + line[:120].ljust(120), end=end, file=sys.stderr, flush=True)
        elif self.done >= self.total:
            print(line, file=sys.stderr, flush=True)


#: Profiled iterations per model: the detail policy's first 10 run with every hook, the steady ones after them time
#: the step without the submodules' hooks, which the chain's stage times are scaled to
#: (:mod:`planner.discovery.time_scale`).
PROFILED_ITERATIONS = 14


def profile_model(spec: DemoModel, out_dir: Path, tag: str, iterations: int) -> Path:
    """Profiles a few training iterations of one embedded model; returns the run directory."""
    import torch

    from examples import zoo
    from memprof import MemoryProfiler

    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = make_optimizer(model)
    progress = Progress(f"profiling {spec.name}", iterations)
    # inline: a few steps whose layer times feed the planner; a worker starting beside them would slow them
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=f"{spec.name}-{tag}", print_period=0,
                        background=False) as prof:
        for _ in range(iterations):
            zoo.train_step(model, optimizer, make_batch(spec.batch_size))  # one batch alive at a time
            prof.record_stats()
            progress.step()
    return prof.run_dir


def estimate_model(spec: DemoModel, out_dir: Path, tag: str) -> Estimate:
    """The estimated memory of one training step of an embedded model, before it has run (fake tensors)."""
    import torch

    from memprof import estimate

    torch.manual_seed(0)
    model, make_batch = spec.build()

    def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(model(inputs), targets)

    return estimate(model, make_batch(spec.batch_size), loss_fn, lambda params: torch.optim.Adam(params, lr=1e-3),
                    out_dir=out_dir, run_id=f"{spec.name}-{tag}-estimate")


def estimate_line(spec: DemoModel, found: Estimate, run_dir: Path) -> str:
    """The estimate beside the profiled run's measured step peak (its iterations after the first, with state)."""
    from memprof import load_trace

    summary = load_trace(run_dir).iterations
    steady = summary[summary["iteration"] >= 1] if len(summary) > 1 else summary
    measured = int(steady["peak_allocated_bytes"].max())
    error = (measured - found.peak_bytes) / found.peak_bytes if found.peak_bytes else 0.0
    return (f"{spec.name}: estimated step peak {format_bytes(found.peak_bytes)} before running ({found.seconds:.1f} s "
            f"on fake tensors); measured {format_bytes(measured)} ({error:+.2%})")


def plan_and_measure(spec: DemoModel, run_dir: Path, out_dir: Path, tag: str, measure: bool) -> list[str]:
    """Plans every algorithm at several budgets and executes a selection; returns summary lines."""
    import torch

    from memprof import load_trace
    from planner import (
        ALGORITHMS,
        InfeasibleBudgetError,
        chain_from_trace,
        measure_schedule,
        min_feasible_budget,
        solve,
        store_all_budget,
    )

    trace = load_trace(run_dir)
    chain = chain_from_trace(trace, spec.container)
    low, high = min_feasible_budget(chain), store_all_budget(chain)
    budgets = sorted({int(low + f * (high - low)) for f in BUDGET_FRACTIONS})
    algorithms = [a for a in ALGORITHMS if a != "exact"]
    schedules_dir = run_dir / "schedules"
    schedules_dir.mkdir(exist_ok=True)
    progress = Progress(f"planning {spec.name}", len(algorithms) * len(budgets))
    selected = []
    for algorithm in algorithms:
        for budget in budgets:
            try:
                schedule = solve(chain, budget, algorithm=algorithm)
            except InfeasibleBudgetError:
                progress.step(f"{algorithm}: infeasible at {format_bytes(budget)}")
                continue
            schedule.to_json(schedules_dir / f"{algorithm}-{budget}.json")
            if (algorithm in ("rotor", "periodic") and budget in (budgets[0], budgets[len(budgets) // 2])) or (
                    algorithm == "store_all"):
                selected.append(schedule)
            progress.step(algorithm)
    what = "whole-step budgets" if chain.step is not None else "chain-only budgets"
    peak = "store-all step peak" if chain.step is not None else "store-all chain peak"
    where = chain.source.get("container", spec.container) or "the model"
    lines = [f"{spec.name}: chain of {chain.length} stages in '{where}'; {peak} {format_bytes(high)}; "
             f"{what} {format_bytes(low)} (the least) .. {format_bytes(high)}"]
    if not measure:
        return lines
    progress = Progress(f"measuring {spec.name}", len(selected))
    for schedule in selected:
        torch.manual_seed(0)
        model, make_batch = spec.build()
        run_id = f"{spec.name}-{tag}-measured-{schedule.algorithm}-{schedule.budget_bytes}"
        _, cmp = measure_schedule(model, make_batch, schedule, out_dir, container=spec.container,
                                  batch_size=spec.batch_size, run_id=run_id, source_run=trace.run_id,
                                  optimizer=make_optimizer(model))
        progress.step(schedule.algorithm)
        lines.append(measured_line(schedule, cmp))
    return lines


def measured_line(schedule: Schedule, cmp: Comparison) -> str:
    """One summary line of a measured schedule: its budget, predicted and measured peaks and times.

    The peaks are the whole training step's (what the device has) when the schedule's chain has step
    costs, the chain's activation memory otherwise.
    """
    what = "step peak" if cmp.whole_step else "activation peak"
    predicted, measured = cmp.predicted_peak_bytes, cmp.measured_peak_bytes
    return (f"  {schedule.algorithm} at budget {format_bytes(schedule.budget_bytes or 0)}: predicted {what} "
            f"{format_bytes(predicted)}, measured {format_bytes(measured)} ({cmp.peak_error:+.1%}); time predicted "
            f"{cmp.predicted_makespan_ms:.1f} ms, measured {cmp.measured_step_ms:.1f} ms")


LONG_CHAIN_STAGES = 3000
LONG_CHAIN_SNAPSHOTS = 10


def long_chain_lines(length: int = LONG_CHAIN_STAGES, snapshots: int = LONG_CHAIN_SNAPSHOTS) -> list[str]:
    """A hand-written chain of ``length`` small identical stages solved by binomial checkpointing.

    Too long for rotor's table (it would fall back to binomial); the budget fits ``snapshots`` snapshots.
    """
    from planner import Chain, OpKind, Stage, simulate, solve
    from planner.solvers import binomial
    from planner.solvers.store_all import store_all_ops

    stage = Stage(forward_ms=0.2, backward_ms=0.4, output_bytes=2**20, saved_bytes=2**20, grad_bytes=2**20)
    chain = Chain(f"long-{length}", 2**20, (stage,) * (length + 1))
    budget = int(binomial.memory_bounds(chain)[snapshots])
    started = time.perf_counter()
    schedule = solve(chain, budget, "binomial")
    seconds = time.perf_counter() - started
    forwards = sum(op.kind is not OpKind.B for op in schedule.ops)
    store_all = simulate(chain, store_all_ops(chain))
    all_peak, all_ms = store_all.peak_bytes, store_all.makespan_ms
    return [
        f"long chain: {length} stages of {format_bytes(stage.output_bytes)}; binomial checkpointing with "
        f"{schedule.params.snapshots} snapshots in {format_bytes(budget)} (store-all {format_bytes(all_peak)}) "
        f"solved in {seconds:.2f} s",
        f"  {forwards} forward evaluations (optimal for {length + 1} steps and {snapshots} snapshots: "
        f"{binomial.forward_count(length + 1, snapshots)}); predicted peak {format_bytes(schedule.predicted_peak_bytes or 0)}, "
        f"time {schedule.predicted_makespan_ms:.0f} ms (store-all {all_ms:.0f} ms)",
    ]


def run_demo(args: argparse.Namespace) -> int:
    """Runs the demo; returns the exit code.

    Raises:
        MissingExtraError: it is to serve the dashboard, and dash or plotly is not installed (checked first).
        ServeError: nothing can listen on ``--host``:``--port``.
    """
    if not args.no_serve:  # before minutes of profiling, not after
        require_dashboard_extra()
        check_can_listen(args.host, args.port)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]  # a second run never mixes with the first
    started = time.perf_counter()
    summary = []
    progress = Progress("estimating", len(DEMO_MODELS))
    estimates = {}
    for spec in DEMO_MODELS:  # before anything runs: what each step will need
        estimates[spec.name] = estimate_model(spec, out_dir, tag)
        progress.step(spec.name)
    for spec in DEMO_MODELS:
        run_dir = profile_model(spec, out_dir, tag, args.iterations)
        summary.append(estimate_line(spec, estimates[spec.name], run_dir))
        summary += plan_and_measure(spec, run_dir, out_dir, tag, measure=not args.no_measure)
    summary += long_chain_lines()
    print("\n".join(["", *summary, f"demo finished in {time.perf_counter() - started:.0f} s; traces in {out_dir}"]))
    if args.no_serve:
        return 0
    serve(out_dir, args.host, args.port)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof demo`` to the ``memprof`` command."""
    parser = subparsers.add_parser("demo", help="profile embedded models, plan, measure, then serve the dashboard")
    parser.add_argument("--out", default="traces", help="folder for the traces (default: traces/)")
    parser.add_argument("--iterations", type=whole_number(1), default=PROFILED_ITERATIONS,
                        help=f"profiled iterations per model (default {PROFILED_ITERATIONS}: past the detail "
                             "policy's first 10, the steady ones time the step without the hooks)")
    parser.add_argument("--no-serve", action="store_true", help="stop before serving the dashboard")
    parser.add_argument("--no-measure", action="store_true", help="plan only; do not execute schedules")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface for the dashboard (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"port for the dashboard, 1..65535 (default {DEFAULT_PORT})")
    parser.set_defaults(func=run_demo)
