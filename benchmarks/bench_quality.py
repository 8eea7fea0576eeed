"""Predicted against measured, and what checkpointing buys, on the zoo models (CPU).

For each model: profile it, build its chain, then for every algorithm at three budgets (the
minimum feasible, the middle, store-all) plan, simulate, execute under the profiler and compare.
Activation memory outside the chain (the model's input, the stem and head, the loss) is not in
the chain's prediction; it is measured once with store-all and added to every prediction, so the
error columns compare like with like. Then: memory saved against time paid (the smallest measured
peak the ``rotor`` schedule reaches within 1.35x of store-all's step time), and ``rotor`` against
the best ``periodic`` (``checkpoint_sequential``) at equal measured memory.

Run ``python -m benchmarks.bench_quality [--models mlp cnn transformer] [--steps 4]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from memprof import MemoryProfiler, load_trace, zoo
from memprof.units import format_bytes
from planner import Chain
from planner.measure import measure_schedule

ALGORITHMS = ("store_all", "periodic", "sqrt", "revolve", "rotor", "rotor_optimal")
TIME_LIMIT = 1.35
PAIRED = "rotor@periodic"  # rotor solved for the budget periodic's schedule needs


@dataclass(frozen=True)
class Spec:
    """A benchmark model and where its chain is."""

    name: str
    build: Callable[[], zoo.ModelAndData]
    batch_size: int
    container: str | None


SPECS = {
    "mlp": Spec("mlp", lambda: zoo.mlp(blocks=12, width=512, in_features=256), 64, None),
    "cnn": Spec("cnn", lambda: zoo.cnn(channels=32, blocks=6, image=32), 16, "features"),
    "transformer": Spec("transformer", lambda: zoo.transformer(vocab=512, dim=128, heads=4, layers=6, seq=64), 8, "h"),
}


@dataclass(frozen=True)
class Row:
    """One executed schedule."""

    model: str
    algorithm: str
    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_ms: float
    measured_ms: float


def _chain(spec: Spec, out: Path, steps: int) -> tuple[Chain, str]:
    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # inline: a short run whose layer times feed the planner (see planner.measure.measure_schedule)
    with MemoryProfiler(model, optimizer, out_dir=out, print_period=0, background=False) as prof:
        for _ in range(steps):
            zoo.train_step(model, optimizer, make_batch(spec.batch_size))
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    return Chain.from_trace(trace, spec.container), trace.run_id


def run_model(spec: Spec, steps: int) -> list[Row]:
    """Plans, executes and measures every algorithm at three budgets for one model."""
    from planner import InfeasibleBudgetError, min_feasible_budget, solve, store_all_budget

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        chain, source = _chain(spec, Path(tmp), steps)
        low, high = min_feasible_budget(chain), store_all_budget(chain)
        for budget in (low, (low + high) // 2, high):
            for algorithm in ALGORITHMS:
                try:
                    schedule = solve(chain, budget, algorithm=algorithm)
                except InfeasibleBudgetError:
                    continue
                rows.append(_measure(spec, schedule, tmp, steps, source, algorithm))
                if algorithm == "periodic":  # rotor at exactly the memory periodic needs
                    paired = solve(chain, int(schedule.predicted_peak_bytes or budget), algorithm="rotor")
                    rows.append(_measure(spec, paired, tmp, steps, source, PAIRED))
    return rows


def _measure(spec: Spec, schedule, out: str, steps: int, source: str, label: str) -> Row:
    torch.manual_seed(0)
    model, make_batch = spec.build()
    _, cmp = measure_schedule(model, make_batch, schedule, out, container=spec.container, steps=steps,
                              batch_size=spec.batch_size, source_run=source)
    return Row(spec.name, label, int(schedule.budget_bytes or 0), cmp.predicted_peak_bytes, cmp.measured_peak_bytes,
               cmp.predicted_makespan_ms, cmp.measured_step_ms)


def _outside(rows: list[Row]) -> int:
    base = [r for r in rows if r.algorithm == "store_all"]
    return statistics.median(r.measured_peak_bytes - r.predicted_peak_bytes for r in base) if base else 0


def predicted_table(rows: list[Row]) -> str:
    """Section 4: predicted vs measured peak and time per algorithm and budget."""
    lines = ["| model | algorithm | budget | predicted peak (+outside) | measured peak | peak error | predicted ms | measured ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        outside = _outside(mine)
        for r in mine:
            predicted = r.predicted_peak_bytes + outside
            error = 100 * (r.measured_peak_bytes / max(predicted, 1) - 1)
            lines.append(f"| {model} | {r.algorithm} | {format_bytes(r.budget_bytes)} | {format_bytes(predicted)} | "
                         f"{format_bytes(r.measured_peak_bytes)} | {error:+.1f}% | {r.predicted_ms:.1f} | {r.measured_ms:.1f} |")
    return "\n".join(lines)


def _rotor_vs_periodic(mine: list[Row]) -> str:
    """Median over periodic runs of periodic's step time over the paired rotor's (same memory budget)."""
    periodic = [r for r in mine if r.algorithm == "periodic"]
    paired = [r for r in mine if r.algorithm == PAIRED]
    ratios = [p.measured_ms / r.measured_ms for p, r in zip(periodic, paired)]
    peaks = [f"{r.measured_peak_bytes / max(p.measured_peak_bytes, 1):.2f}" for p, r in zip(periodic, paired)]
    return f"{statistics.median(ratios):.2f}x (rotor/periodic measured peak {', '.join(peaks)})" if ratios else "n/a"


def savings_table(rows: list[Row]) -> str:
    """Section 5: memory saved for time paid, and rotor vs the best periodic at equal memory."""
    lines = ["| model | store-all peak / ms | smallest rotor peak within 1.35x time | saved | "
             "rotor vs periodic: throughput ratio at periodic's memory |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        base = min((r for r in mine if r.algorithm == "store_all"), key=lambda r: r.measured_ms, default=None)
        if base is None:
            continue
        within = [r for r in mine if r.algorithm == "rotor" and r.measured_ms <= TIME_LIMIT * base.measured_ms]
        best = min(within, key=lambda r: r.measured_peak_bytes, default=None)
        reached = f"{format_bytes(best.measured_peak_bytes)} / {best.measured_ms:.1f} ms" if best else "n/a"
        saved = f"{100 * (1 - best.measured_peak_bytes / base.measured_peak_bytes):.0f}%" if best else "n/a"
        lines.append(f"| {model} | {format_bytes(base.measured_peak_bytes)} / {base.measured_ms:.1f} ms | {reached} | "
                     f"{saved} | {_rotor_vs_periodic(mine)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Runs the benchmark and prints both tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(SPECS))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    rows = [row for name in args.models for row in run_model(SPECS[name], args.steps)]
    text = ("### Predicted vs measured\n\n" + predicted_table(rows) + "\n\n### Memory saved vs time paid\n\n"
            + savings_table(rows))
    print(text)
    return text


if __name__ == "__main__":
    main()
