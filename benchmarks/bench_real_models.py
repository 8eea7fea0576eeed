"""The planner on models written by others: Hugging Face transformers and torchvision-style CNNs (CPU).

For each model of ``tests/planner/real_models.py`` (GPT-2, BERT, Llama and T5 built from ``transformers``
configs with random weights; a ResNet, a MobileNetV2 and a ViT written the way torchvision writes them):
profile a few SGD steps, let ``planner.chain_from_trace`` find the chain at block level on its own (no container
named), then execute ``store_all`` at ``store_all_budget`` and ``rotor`` at 8 whole-step budgets from
``min_feasible_budget`` to ``store_all_budget`` (nearby budgets that give the same schedule share one
entry), each applied in place to the model's own forward (``measure_schedule``, with the profiled run's
optimizer). Budgets and predictions are the whole training step's memory (weights, optimizer state,
batch, embeddings and logits outside the chain, gradients); the measured step peak is the allocator's.
"No schedule" is the profiled run's own step peak (plain autograd, no executor). Batches are made inside
each step (``benchmarks.bench_quality.made_in_step``). A schedule the executor fails on is reported in
the tables (its chain, schedule and traceback are kept in ``$TMPDIR/memprof-bench-failures/``) and the
run goes on. Step times are the median over ``--repeats`` runs (interleaved: every schedule once, then
again) of each run's median forward + backward time, the first step of a run excluded; rotor at
store-all's budget usually runs store-all's own schedule, so the two times show the noise.

torch runs on 1 intra-op thread here (``torch.set_num_threads(1)``, set at import) for steadier timings
on a shared machine; the step times are therefore single-core times.

The models whose blocks do not form a chain (``tests/planner/graph_models.py``: a U-Net whose decoder
reads the encoder's outputs, an ``nn.Transformer`` encoder-decoder whose decoder layers all read the
encoder's output, parallel branches) run the same way with ``--models unet seq2seq``; with ``--algorithms
rotor selective`` the profile records the ops of one step (``ops=True``) and ``selective`` is planned and
executed at the same number of budgets from its own minimum.

Run ``python -m benchmarks.bench_real_models [--models gpt2 bert ...] [--algorithms rotor selective]
[--steps 3] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

torch.set_num_threads(1)  # steadier timings on a shared CPU; every number below is single-threaded

from benchmarks.bench_quality import made_in_step  # noqa: E402
from memprof import MemoryProfiler, load_trace  # noqa: E402
from memprof.units import format_bytes  # noqa: E402
from planner import Chain, chain_from_trace, min_feasible_budget, solve, store_all_budget  # noqa: E402
from planner.executor import remove_schedule  # noqa: E402
from planner.measure.comparison import step_peak_bytes  # noqa: E402
from planner.measure.runs import measure_schedule  # noqa: E402
from planner.model.schedule import Schedule  # noqa: E402
from tests.planner.graph_models import GRAPH_BUILDERS  # noqa: E402
from tests.planner.real_models import ALL_BUILDERS  # noqa: E402

TIME_LIMIT = 1.35
ROTOR_BUDGETS = 8
BATCH_SIZES = {"gpt2": 8, "bert": 8, "llama": 8, "t5": 8, "resnet": 8, "mobilenet": 16, "vit": 8,  # ~30-55 ms a step
               "unet": 4, "seq2seq": 16, "branches": 2}  # on one core
BUILDERS = {**ALL_BUILDERS, **GRAPH_BUILDERS}
ALGORITHMS = ("rotor", "selective")


@dataclass
class Run:
    """One schedule, executed ``repeats`` times; ``budgets``: every budget the solver returned it for."""

    algorithm: str
    schedule: Schedule
    budgets: list[int] = field(default_factory=list)
    measured_step_peaks: list[int] = field(default_factory=list)
    measured_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # runs the executor could not finish

    @property
    def ok(self) -> bool:
        return bool(self.measured_step_peaks)

    @property
    def predicted(self) -> int:
        return int(self.schedule.predicted_step_peak_bytes or 0)

    @property
    def measured(self) -> int:
        """The highest whole-step peak over the repeats."""
        return max(self.measured_step_peaks)

    @property
    def ms(self) -> float:
        return statistics.median(self.measured_ms)

    @property
    def worst_error(self) -> float:
        return max(abs(peak / max(self.predicted, 1) - 1) for peak in self.measured_step_peaks)


@dataclass
class Result:
    """A model's chain and its executed schedules."""

    name: str
    batch_size: int
    chain: Chain
    runs: list[Run]
    plain_step_peak: int  # the profiled run's step peak: no schedule, plain autograd


def run_model(name: str, steps: int, repeats: int, out: Path, algorithms: tuple[str, ...] = ("rotor",)) -> Result:
    """Profiles one model, plans store-all and ``algorithms`` at several budgets each, and executes them."""
    real = BUILDERS[name]()
    batch_size = BATCH_SIZES.get(name, 8)
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    recipe, step_loss = made_in_step(real.make_batch, real.loss)
    # inline: a short run whose layer times feed the planner (see planner.measure.runs.measure_schedule)
    with MemoryProfiler(real.model, optimizer, out_dir=out, print_period=0, background=False,
                        ops="selective" in algorithms) as prof:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            step_loss(real.model, recipe(batch_size)).backward()
            optimizer.step()
            prof.record_stats()
    trace = load_trace(prof.run_dir)
    chain = chain_from_trace(trace)
    high = store_all_budget(chain)
    runs = [Run("store_all", solve(chain, high, "store_all"), [high])]
    planned: dict[tuple, Run] = {}  # nearby budgets often give the same schedule: it is run once
    for algorithm in algorithms:
        low = min_feasible_budget(chain, algorithm)
        for i in range(ROTOR_BUDGETS):
            budget = low + (high - low) * i // (ROTOR_BUDGETS - 1)
            schedule = solve(chain, budget, algorithm)
            planned.setdefault((algorithm, schedule.ops), Run(algorithm, schedule)).budgets.append(budget)
    runs += planned.values()
    for _ in range(repeats):  # interleaved, so that a slow spell of the machine spreads over every schedule
        for run in runs:
            try:
                _, cmp = measure_schedule(real.model, recipe, run.schedule, out, steps=steps,
                                          batch_size=batch_size, source_run=trace.run_id, loss=step_loss,
                                          optimizer=optimizer)
            except Exception as exc:  # noqa: BLE001 -- reported in the tables and kept for reproduction
                run.errors.append(f"{type(exc).__name__}: {exc}")
                _keep_failure(name, chain, run, exc)
                continue
            finally:
                remove_schedule(real.model)
            run.measured_step_peaks.append(cmp.measured_step_peak_bytes)
            run.measured_ms.append(cmp.measured_step_ms)
    return Result(name, batch_size, chain, runs, step_peak_bytes(trace))


def _keep_failure(name: str, chain: Chain, run: Run, exc: Exception) -> None:
    """Writes the chain, the schedule and the traceback of a failed run where they outlive the benchmark."""
    folder = Path(tempfile.gettempdir()) / "memprof-bench-failures"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}-{run.algorithm}-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps({"model": name, "chain": chain.to_dict(), "schedule": run.schedule.to_dict(),
                                "traceback": traceback.format_exception(exc)}, indent=1), encoding="utf-8")
    print(f"{name}: {run.algorithm} schedule failed ({type(exc).__name__}: {exc}); kept in {path}", file=sys.stderr)


def _chain_text(chain: Chain) -> str:
    first, last = chain.stages[0].modules, chain.stages[-2].modules
    span = f"{first[0]}..{last[-1]}" if first and last else chain.name
    return f"`{span}` ({chain.length} stages)"


def _peak_text(run: Run) -> str:
    return f"{format_bytes(run.predicted)} / {format_bytes(run.measured)}"


def _best(result: Result) -> tuple[Run, Run | None]:
    base = result.runs[0]
    within = [r for r in result.runs[1:] if r.ok and base.ok and r.ms <= TIME_LIMIT * base.ms]
    return base, min(within, key=lambda r: (r.measured, r.ms), default=None)


def _failures(result: Result) -> str:
    failed = sum(1 for r in result.runs if r.errors)
    return f" ({failed} schedule{'s' if failed > 1 else ''} failed)" if failed else ""


def summary_table(results: list[Result]) -> str:
    """One row per model: its chain, store-all, the smallest schedule within the time limit, the worst peak
    error."""
    lines = ["| model | batch | chain found | no schedule: step peak | store-all step peak (predicted / measured) | "
             "store-all ms | "
             f"smallest schedule's step peak within {TIME_LIMIT}x time (predicted / measured) | its ms | saved | "
             "max peak error |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for result in results:
        base, best = _best(result)
        error = max((r.worst_error for r in result.runs if r.ok), default=float("nan"))
        if not base.ok:
            lines.append(f"| {result.name} | {result.batch_size} | {_chain_text(result.chain)} | "
                         f"{format_bytes(result.plain_step_peak)} | store-all failed | "
                         f"n/a | n/a | n/a | n/a | {100 * error:.1f}%{_failures(result)} |")
            continue
        if best is None:
            reached = ms = saved = "n/a"
        else:
            reached, ms = _peak_text(best), f"{best.ms:.1f}"
            saved = f"{100 * (1 - best.measured / base.measured):.0f}%"
        lines.append(f"| {result.name} | {result.batch_size} | {_chain_text(result.chain)} | "
                     f"{format_bytes(result.plain_step_peak)} | {_peak_text(base)} | "
                     f"{base.ms:.1f} | {reached} | {ms} | {saved} | {100 * error:.1f}%{_failures(result)} |")
    return "\n".join(lines)


def detail_table(result: Result) -> str:
    """Every schedule run on one model."""
    base = result.runs[0]
    lines = [f"#### {result.name}", "",
             "| algorithm | budgets | predicted step peak | measured step peak | error | predicted ms | measured ms | "
             "vs store-all ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in result.runs:
        budgets = ", ".join(format_bytes(b) for b in run.budgets)
        predicted_ms = f"{run.schedule.predicted_makespan_ms or 0.0:.1f}"
        if not run.ok:
            lines.append(f"| {run.algorithm} | {budgets} | {format_bytes(run.predicted)} | "
                         f"failed: {run.errors[0][:120]} | | {predicted_ms} | | |")
            continue
        error = 100 * (run.measured / max(run.predicted, 1) - 1)
        failed = f" ({len(run.errors)} of {len(run.errors) + len(run.measured_ms)} runs failed)" if run.errors else ""
        ratio = f"{run.ms / base.ms:.2f}x" if base.ok else "n/a"
        lines.append(f"| {run.algorithm} | {budgets} | {format_bytes(run.predicted)} | "
                     f"{format_bytes(run.measured)}{failed} | {error:+.1f}% | {predicted_ms} | {run.ms:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Runs the benchmark and prints its tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", choices=list(BUILDERS), default=list(ALL_BUILDERS))
    parser.add_argument("--algorithms", nargs="*", choices=ALGORITHMS, default=["rotor"],
                        help="planned beside store-all (selective: the profile records one step's ops)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run (the first is excluded)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per schedule (step time: their median)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_model(name, args.steps, args.repeats, Path(tmp), tuple(args.algorithms))
                   for name in args.models]
    text = "\n\n".join(["### Summary", summary_table(results), "### Every schedule",
                        *(detail_table(r) for r in results)])
    print(text)
    return text


if __name__ == "__main__":
    main()
