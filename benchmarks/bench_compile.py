"""memprof's schedules under torch.compile against compile's own knob, ``activation_memory_budget``, side by side.

One process, one model (Hugging Face GPT-2 or Llama from its config, random weights, dropout 0, ``use_cache=False``,
AdamW, CPU inductor, torch's default threads). memprof profiles the model compiled with each budget of
``--budgets`` (its costing iterations run each block as its own compiled region, :mod:`memprof.capture.regional`)
and plans each chain. Then, for each budget, one row per variant:

- *partitioner*: ``torch.compile`` with inductor, its min-cut partitioner held to that budget (a backend of its
  own per budget; every variant is compiled afresh before it is measured, so the rounds can alternate);
- *memprof*: memprof's rotor schedule planned at the partitioner's measured step peak, on the chain profiled
  with compile's defaults (budget 1.0), its stages and the model around them compiled so: what a user of
  plain ``torch.compile`` gets from memprof;
- *memprof+knob*: the schedule memprof predicts fastest within that peak over the chains of every budget (the
  knob column says which), its stages and the model around them compiled with that budget: memprof choosing
  compile's knob as well as the blocks to recompute.

The last rows (*least*) are each memprof variant's least-budget schedule: the lowest peak it reaches. Each
variant's training step (``zero_grad``, forward, backward, ``optimizer.step()``) is measured the same way: the
step peak is the state it starts with plus the CPU allocator's highest rise during it (torch.profiler's raw
``[memory]`` events, :func:`planner.measure.compile_baseline.measure_step`), the step time and the forward +
backward time (what a schedule's makespan predicts) the medians of ``--repeats`` steps; the variants alternate
within each of ``--rounds`` rounds and the table reports medians, memprof's predictions in parentheses.

Run ``python -m benchmarks.bench_compile [--model gpt2|llama] [--layers 6 --width 256 --seq 256 --batch 4]
[--budgets 1.0,0.7,0.5,0.3,0.1] [--rounds 3] [--repeats 3] [--out DIR]`` (``--quick``: 2 layers of 64, sequence
64; ``--out``: keep the profiled runs, with the partitioner's points beside the budget-1.0 one,
``compile_points.json``, which the dashboard's Pareto figure draws).
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memprof.units import format_bytes
from planner.measure.compile_baseline import measure_step

BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1)


@dataclass(frozen=True)
class Measured:
    """One variant's step, measured in one round."""

    variant: str
    budget: float
    peak_bytes: int
    held_bytes: int
    step_ms: float
    compute_ms: float  # forward + backward alone: what a schedule's makespan predicts


def build(kind: str, layers: int, width: int, heads: int) -> nn.Module:
    """The model from its config, random weights (seeded), dropout 0, no key/value cache, in training mode."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(
            hidden_size=width, intermediate_size=width * 8 // 3, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(heads // 2, 1), max_position_embeddings=1024, use_cache=False)).train()
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, use_cache=False)).train()


def partitioner_backend(budget: float) -> Callable[..., Any]:
    """Inductor with its min-cut partitioner held to ``activation_memory_budget=budget`` (the partitioner reads
    the setting while it splits the joint graph, inside this backend)."""
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        with functorch_config.patch(activation_memory_budget=float(budget)):
            return compile_fx(gm, example_inputs)

    backend.__name__ = f"inductor_budget_{budget}"
    return backend


def profile_and_plan(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor,
                     out: str, backend: Any = "inductor", name: str = "compiled") -> tuple[Any, Any]:
    """Profiles the model compiled with ``backend`` for 5 steps; returns its run directory and its chain."""
    import torch._dynamo

    from memprof import MemoryProfiler, load_trace
    from planner import chain_from_trace

    torch._dynamo.reset()  # profiled as in a process of its own
    runner = torch.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with MemoryProfiler(runner, optimizer, out_dir=out, run_id=f"{type(model).__name__}-{name}",
                            print_period=0) as profiler:
            for _ in range(5):
                optimizer.zero_grad(set_to_none=True)
                runner(input_ids=ids, labels=ids).loss.backward()
                optimizer.step()
                profiler.record_stats()
    return profiler.run_dir, chain_from_trace(load_trace(profiler.run_dir))


def measure(variant: str, budget: float, runner: Callable[..., Any], model: nn.Module,
            optimizer: torch.optim.Optimizer, ids: torch.Tensor, repeats: int) -> Measured:
    """One variant's step, compiled afresh: dynamo keeps decisions per code object across backends (a frame it gave
    up on after a graph break runs eagerly for every later caller), so every variant starts from a clean slate,
    as in a process of its own; the compile happens in ``measure_step``'s untimed first step."""
    import torch._dynamo

    torch._dynamo.reset()
    loss = functools.partial(lambda r: r(input_ids=ids, labels=ids).loss, runner)
    peak, held, ms = measure_step(loss, model, optimizer, repeats, batch=(ids,))
    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        loss().backward()
        times.append((time.perf_counter() - started) * 1e3)
    return Measured(variant, budget, peak, held, ms, statistics.median(times))


def run(args: argparse.Namespace) -> list[str]:
    """Profiles the model under each budget, measures every variant with the rounds alternating, and returns the
    report's lines."""
    import torch._dynamo

    limits = LimitWatch()  # a frame past dynamo's recompile limit would run eagerly, silently
    logging.getLogger("torch._dynamo.convert_frame").addFilter(limits)
    model = build(args.model, args.layers, args.width, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq))
    backends = {b: partitioner_backend(b) for b in args.budgets}
    runners = {b: torch.compile(model, backend=backends[b]) for b in args.budgets}
    default = max(args.budgets)  # 1.0: compile's default partitioner
    chains, run_dir = {}, None
    with tempfile.TemporaryDirectory() as scratch:
        for knob in args.budgets:  # memprof profiles the model as compiled with each setting of the knob
            where, chains[knob] = profile_and_plan(model, optimizer, ids, args.out or scratch, backends[knob],
                                                   f"budget-{knob}")
            run_dir = where if knob == default else run_dir
            print(f"profiled under activation_memory_budget={knob}", flush=True)
    plans: dict[tuple[str, float], Plan | None] = {
        ("memprof", 0.0): least({default: chains[default]}), ("memprof+knob", 0.0): least(chains)}
    rows: list[Measured] = []
    for round_ in range(args.rounds):
        for budget in (*args.budgets, 0.0):
            if budget:
                rows.append(measure("partitioner", budget, runners[budget], model, optimizer, ids, args.repeats))
                peak = rows[-1].peak_bytes if round_ == 0 else None
                for variant, usable in (("memprof", {default: chains[default]}), ("memprof+knob", chains)):
                    plans.setdefault((variant, budget), fastest(usable, peak) if peak is not None else None)
            for variant in ("memprof", "memprof+knob"):
                plan = plans.get((variant, budget))
                if plan is not None:
                    rows.append(run_plan(variant, budget, plan, model, runners, backends, optimizer, ids, args))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    if args.out and run_dir is not None:
        print(f"wrote {keep_points(run_dir, rows, args.budgets)}: memprof dashboard {args.out} shows the "
              "partitioner's points on the Planner view's Pareto figure")
    if limits.hit:
        print(f"WARNING: dynamo hit its recompile limit ({limits.hit[0][:200]}): some variants ran partly eagerly; "
              "this table is not valid", flush=True)
    return table(rows, plans, chains[default], args)


class LimitWatch(logging.Filter):
    """Keeps dynamo's "hit config.recompile_limit" messages: past it a frame runs eagerly without an error."""

    def __init__(self) -> None:
        super().__init__()
        self.hit: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "recompile_limit" in message:
            self.hit.append(message)
        return True


@dataclass(frozen=True)
class Plan:
    """A schedule and the ``activation_memory_budget`` its model is compiled with (around and inside its stages)."""

    knob: float
    schedule: Any


def fastest(chains: dict[float, Any], budget_bytes: int) -> Plan | None:
    """Among the chains profiled under each knob, the schedule memprof predicts fastest within ``budget_bytes``
    (``None``: none fits)."""
    from planner import solve
    from planner.errors import InfeasibleBudgetError

    found = []
    for knob, chain in chains.items():
        try:
            found.append(Plan(knob, solve(chain, budget_bytes)))
        except InfeasibleBudgetError:
            continue
    return min(found, key=lambda p: p.schedule.predicted_makespan_ms, default=None)


def least(chains: dict[float, Any]) -> Plan:
    """The schedule with the lowest predicted step peak memprof reaches, over the chains of each knob."""
    from planner import min_feasible_budget, solve

    plans = [Plan(knob, solve(chain, min_feasible_budget(chain))) for knob, chain in chains.items()]
    return min(plans, key=lambda p: p.schedule.predicted_step_peak_bytes or 0)


def run_plan(variant: str, budget: float, plan: Plan, model: nn.Module, runners: dict[float, Any],
             backends: dict[float, Any], optimizer: torch.optim.Optimizer, ids: torch.Tensor,
             args: argparse.Namespace) -> Measured:
    """Measures ``plan``: its schedule applied, its stages and the model around them compiled with its knob."""
    from planner import apply_schedule, remove_schedule

    apply_schedule(model, plan.schedule, compile=backends[plan.knob])
    try:
        return measure(variant, budget, runners[plan.knob], model, optimizer, ids, args.repeats)
    finally:
        remove_schedule(model)


def keep_points(run_dir: Any, rows: list[Measured], budgets: tuple[float, ...]) -> Any:
    """Writes the partitioner's medians beside the profiled run (``compile_points.json``) for the dashboard."""
    from planner import CompilePoint, write_compile_points

    points = []
    for budget in budgets:
        mine = [r for r in rows if r.variant == "partitioner" and r.budget == budget]
        points.append(CompilePoint(
            activation_memory_budget=budget, step_peak_bytes=int(statistics.median(r.peak_bytes for r in mine)),
            held_bytes=int(statistics.median(r.held_bytes for r in mine)), flops=0,
            step_ms=float(statistics.median(r.step_ms for r in mine))))
    return write_compile_points(run_dir, points)


def table(rows: list[Measured], plans: dict[tuple[str, float], Plan | None], chain: Any,
          args: argparse.Namespace) -> list[str]:
    """The markdown table: per budget, the partitioner's medians and each memprof variant's, with its predictions."""
    from planner import store_all_budget

    def median(variant: str, budget: float, field: str) -> float:
        values = [getattr(r, field) for r in rows if r.variant == variant and r.budget == budget]
        return statistics.median(values) if values else float("nan")

    lines = [f"{args.model}, {args.layers} layers, width {args.width}, sequence {args.seq}, batch {args.batch}, "
             f"{torch.get_num_threads()} threads, {args.rounds} rounds x {args.repeats} steps; store-all predicted "
             f"{format_bytes(store_all_budget(chain))} (profiled compiled)",
             "",
             "| budget | variant | knob | step peak (predicted) | step ms | fwd+bwd ms (predicted makespan) "
             "| peak / partitioner's | step time / partitioner's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for budget in (*args.budgets, 0.0):
        label = f"{budget:g}" if budget else "least"
        p_peak, p_ms = median("partitioner", budget, "peak_bytes"), median("partitioner", budget, "step_ms")
        if budget:
            lines.append(f"| {label} | partitioner | {budget:g} | {format_bytes(int(p_peak))} | {p_ms:.0f} | "
                         f"{median('partitioner', budget, 'compute_ms'):.0f} | 1 | 1 |")
        for variant in ("memprof", "memprof+knob"):
            plan = plans.get((variant, budget))
            if plan is None:
                lines.append(f"| {label} | {variant} | | below its least budget | | | | |")
                continue
            m_peak, m_ms = median(variant, budget, "peak_bytes"), median(variant, budget, "step_ms")
            ratios = f"{m_peak / p_peak:.3f} | {m_ms / p_ms:.3f}" if budget else "- | -"
            lines.append(
                f"| {label} | {variant} | {plan.knob:g} | {format_bytes(int(m_peak))} "
                f"({format_bytes(plan.schedule.predicted_step_peak_bytes or 0)}) | {m_ms:.0f} "
                f"| {median(variant, budget, 'compute_ms'):.0f} ({plan.schedule.predicted_makespan_ms:.0f}) | {ratios} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--budgets", type=lambda s: tuple(float(x) for x in s.split(",")), default=BUDGETS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 layers of 64, sequence 64: a smoke run")
    parser.add_argument("--out", default=None, help="keep the profiled run here, with the partitioner's points "
                        "(compile_points.json) for the dashboard's Pareto figure")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.heads, args.seq, args.rounds, args.repeats = 2, 64, 2, 64, 1, 1
    for line in run(args):
        print(line)


if __name__ == "__main__":
    main()
