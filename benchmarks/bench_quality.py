"""Predicted against measured, and what checkpointing buys, on the zoo models (CPU).

For each model: profile it, build its chain, then for every algorithm at three budgets (the
minimum feasible, the middle, store-all) plan, simulate, execute under the profiler and compare.
A chain built from a trace carries what the training step holds besides it (weights, optimizer
state, the batch, the stem, head and loss, the gradients), so budgets and predictions are the
whole training step's memory: ``Schedule.predicted_step_peak_bytes`` against the allocator's
measured peak of the step. Then: memory saved against time paid (the smallest measured step peak
the ``rotor`` schedule reaches within 1.35x of store-all's step time), and ``rotor`` against the
best ``periodic`` (``checkpoint_sequential``) at equal memory (rotor solved for the step peak
periodic's schedule is predicted to need). "no schedule" is the profiled run itself (plain autograd,
no executor), for reference. Batches are made inside each step, the same for every schedule (see
:func:`made_in_step`). ``llama``
(a Hugging Face-style Llama, blocks in an ``nn.ModuleList`` called with keyword side inputs) names no
container: its chain is found.

Step times are single-threaded by default (``--threads 1``): with every core busy, torch's intra-op
threads wait on each other and a step can take ten times as long.

Run ``python -m benchmarks.bench_quality [--models mlp cnn transformer llama] [--steps 4] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.units import format_bytes
from planner import Chain, chain_from_trace
from planner.measure.comparison import compute_ms, step_peak_bytes
from planner.measure.runs import measure_schedule

ALGORITHMS = ("store_all", "periodic", "sqrt", "revolve", "rotor", "rotor_optimal")
TIME_LIMIT = 1.35
PAIRED = "rotor@periodic"  # rotor solved for the whole-step budget periodic's schedule needs
PLAIN = "no schedule"  # the profiled run: plain autograd, no executor


@dataclass(frozen=True)
class Spec:
    """A benchmark model and where its chain is."""

    name: str
    build: Callable[[], zoo.ModelAndData]
    batch_size: int
    container: str | None


SPECS = {
    # activations (~6 MiB) above the weights and gradients (~1.5 MiB): with 512-wide layers at batch 64 the
    # weights and their gradients (24 MiB) set the step's peak and no schedule lowers it.
    "mlp": Spec("mlp", lambda: zoo.mlp(blocks=12, width=128, in_features=128), 512, None),
    "cnn": Spec("cnn", lambda: zoo.cnn(channels=32, blocks=6, image=32), 16, "features"),
    "transformer": Spec("transformer", lambda: zoo.transformer(vocab=512, dim=128, heads=4, layers=6, seq=64), 8, "h"),
    "llama": Spec("llama", lambda: zoo.llama(vocab=512, dim=128, heads=4, kv_heads=2, layers=6, seq=64), 8, None),
}


@dataclass(frozen=True)
class Row:
    """One executed schedule; budget and peaks are the whole training step's."""

    model: str
    algorithm: str
    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_ms: float
    measured_ms: float


def made_in_step(make_batch: Callable[[int], Any], loss: Callable[[nn.Module, Any], torch.Tensor],
                 seed: int = 1000) -> tuple[Callable[[int], Callable[[], Any]], Callable[[nn.Module, Any], torch.Tensor]]:
    """``(make_batch, loss)`` for ``measure_schedule`` that give every schedule the same batches.

    ``make_batch`` returns a recipe (seeded, so the batches are the same on every run whatever the schedule
    draws from the RNG) and ``loss`` makes the batch from it at the start of the step: one batch alive per
    step, as in a training loop.
    """
    counter = itertools.count(seed)

    def recipe(batch_size: int) -> Callable[[], Any]:
        batch_seed = next(counter)

        def make() -> Any:
            torch.manual_seed(batch_seed)
            return make_batch(batch_size)
        return make

    def step_loss(model: nn.Module, make: Callable[[], Any]) -> torch.Tensor:
        return loss(model, make())

    return recipe, step_loss


def _cross_entropy(model: nn.Module, batch: zoo.Batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def _chain(spec: Spec, out: Path, steps: int) -> tuple[Chain, str, Row]:
    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # inline: a short run whose layer times feed the planner (see planner.measure.runs.measure_schedule)
    with MemoryProfiler(model, optimizer, out_dir=out, print_period=0, background=False) as prof:
        for _ in range(steps):
            zoo.train_step(model, optimizer, make_batch(spec.batch_size))
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    plain = Row(spec.name, PLAIN, 0, 0, step_peak_bytes(trace), 0.0, compute_ms(trace))
    return chain_from_trace(trace, spec.container), trace.run_id, plain


def run_model(spec: Spec, steps: int) -> list[Row]:
    """Plans, executes and measures every algorithm at three budgets for one model."""
    from planner import InfeasibleBudgetError, min_feasible_budget, solve, store_all_budget

    with tempfile.TemporaryDirectory() as tmp:
        chain, source, plain = _chain(spec, Path(tmp), steps)
        rows = [plain]
        low, high = min_feasible_budget(chain), store_all_budget(chain)
        for budget in dict.fromkeys((low, (low + high) // 2, high)):  # equal when nothing can be saved
            for algorithm in ALGORITHMS:
                try:
                    schedule = solve(chain, budget, algorithm=algorithm)
                except InfeasibleBudgetError:
                    continue
                rows.append(_measure(spec, schedule, tmp, steps, source, algorithm))
                if algorithm == "periodic":  # rotor at the memory periodic needs
                    # rotor's minimum is rounded up to its memory slots (500): periodic's schedule at the lowest
                    # budget can need a little less than rotor accepts; rotor then gets its own minimum.
                    needed = int(schedule.predicted_step_peak_bytes or budget)
                    paired = solve(chain, max(needed, low), algorithm="rotor")
                    rows.append(_measure(spec, paired, tmp, steps, source, PAIRED))
    return rows


def _measure(spec: Spec, schedule, out: str, steps: int, source: str, label: str) -> Row:
    torch.manual_seed(0)
    model, make_batch = spec.build()
    recipe, step_loss = made_in_step(make_batch, _cross_entropy)
    _, cmp = measure_schedule(model, recipe, schedule, out, container=spec.container, steps=steps,
                              batch_size=spec.batch_size, source_run=source, loss=step_loss)
    if cmp.predicted_step_peak_bytes is None:
        raise AssertionError(f"{spec.name}: the chain has no step costs, so its prediction is not the whole step's")
    return Row(spec.name, label, int(schedule.budget_bytes or 0), cmp.predicted_step_peak_bytes,
               cmp.measured_step_peak_bytes, cmp.predicted_makespan_ms, cmp.measured_step_ms)


def predicted_table(rows: list[Row]) -> str:
    """Section 4: predicted vs measured whole-step peak and time per algorithm and budget."""
    lines = ["| model | algorithm | step budget | predicted step peak | measured step peak | peak error | "
             "predicted ms | measured ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in (r for r in rows if r.algorithm != PLAIN):
        error = 100 * (r.measured_peak_bytes / max(r.predicted_peak_bytes, 1) - 1)
        lines.append(f"| {r.model} | {r.algorithm} | {format_bytes(r.budget_bytes)} | "
                     f"{format_bytes(r.predicted_peak_bytes)} | {format_bytes(r.measured_peak_bytes)} | "
                     f"{error:+.1f}% | {r.predicted_ms:.1f} | {r.measured_ms:.1f} |")
    return "\n".join(lines)


def _rotor_vs_periodic(mine: list[Row]) -> str:
    """Median over periodic runs of periodic's step time over the paired rotor's (same memory budget)."""
    periodic = [r for r in mine if r.algorithm == "periodic"]
    paired = [r for r in mine if r.algorithm == PAIRED]
    ratios = [p.measured_ms / r.measured_ms for p, r in zip(periodic, paired)]
    peaks = [f"{r.measured_peak_bytes / max(p.measured_peak_bytes, 1):.2f}" for p, r in zip(periodic, paired)]
    return f"{statistics.median(ratios):.2f}x (rotor/periodic measured step peak {', '.join(peaks)})" if ratios else "n/a"


def savings_table(rows: list[Row]) -> str:
    """Section 5: memory saved for time paid, and rotor vs the best periodic at equal memory."""
    lines = ["| model | no schedule: step peak / ms | store-all step peak / ms | smallest rotor step peak within "
             "1.35x time | saved | rotor vs periodic: throughput ratio at periodic's memory |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        base = min((r for r in mine if r.algorithm == "store_all"), key=lambda r: r.measured_ms, default=None)
        if base is None:
            continue
        within = [r for r in mine if r.algorithm == "rotor" and r.measured_ms <= TIME_LIMIT * base.measured_ms]
        best = min(within, key=lambda r: r.measured_peak_bytes, default=None)
        reached = f"{format_bytes(best.measured_peak_bytes)} / {best.measured_ms:.1f} ms" if best else "n/a"
        saved = f"{100 * (1 - best.measured_peak_bytes / base.measured_peak_bytes):.0f}%" if best else "n/a"
        plain = next((f"{format_bytes(r.measured_peak_bytes)} / {r.measured_ms:.1f} ms" for r in mine
                      if r.algorithm == PLAIN), "n/a")
        lines.append(f"| {model} | {plain} | {format_bytes(base.measured_peak_bytes)} / {base.measured_ms:.1f} ms | "
                     f"{reached} | {saved} | {_rotor_vs_periodic(mine)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Runs the benchmark and prints both tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(SPECS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: steadier step times on a shared machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [row for name in args.models for row in run_model(SPECS[name], args.steps)]
    text = ("### Predicted vs measured\n\n" + predicted_table(rows) + "\n\n### Memory saved vs time paid\n\n"
            + savings_table(rows))
    print(text)
    return text


if __name__ == "__main__":
    main()
