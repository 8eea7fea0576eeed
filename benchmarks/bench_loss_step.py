"""The loss options' step time on a large vocabulary: store-all against the planned chunked loss, alternated.

Issue 33's target on the large-vocabulary model: the whole-step peak with the loss options at most half of
store-all's, for at most +10% step time. ``bench_selective --model llama`` measures each schedule's bytes and
FLOPs exactly but times each one in its own block of steps, minutes apart, which on a shared machine varies by
up to 50% between two blocks of the same schedule. This benchmark times the two side by side: one profiled step
plans the model (the same chain as ``bench_selective``), the planner's ``selective`` schedule is taken at the
highest activations budget whose measured whole-step peak is at most half of store-all's, and then, round after
round, one step of plain autograd and one step of that schedule run in turn (the order swapped every round),
so that whatever the machine does falls on both alike. Reported: the median of the per-round time ratios, with
their spread, and both step peaks from the CPU allocator.

Run ``python -m benchmarks.bench_loss_step [--rounds 21] [--budgets 8]`` (``--quick``: a 32k vocabulary).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.bench_selective import (
    SIZES,
    Workload,
    build_llama,
    held_and_peak_bytes,
    profiled_chains,
    state_bytes,
)
from memprof.units import format_bytes
from planner import min_feasible_budget, solve, store_all_budget
from planner.model.schedule import Schedule

TARGET_PEAK, TARGET_TIME = 0.5, 1.10  # issue 33: at most half of store-all's step peak, at most +10% step time


def step_peak_bytes(work: Workload, state: int) -> int:
    """The whole step's peak: the fwd+bwd peak above the step's start plus the parameters and their gradients."""
    _, peak = held_and_peak_bytes(work.forward)
    work.model.zero_grad(set_to_none=False)
    return peak + state


def one_step_ms(forward: Callable[[], torch.Tensor]) -> float:
    """Wall time of one forward + backward."""
    started = time.perf_counter()
    forward().backward()
    return (time.perf_counter() - started) * 1e3


def pick_schedule(work: Workload, budgets: int, state: int, plain_peak: int) -> tuple[Schedule, int] | None:
    """The selective schedule at the highest budget (of ``budgets`` between the minimum and store-all's) whose
    measured step peak is at most :data:`TARGET_PEAK` of ``plain_peak``; ``None`` when none is."""
    from planner.executor import apply_schedule, remove_schedule

    with tempfile.TemporaryDirectory() as tmp:
        chain = profiled_chains(work, Path(tmp))["time"]
    low, high = min_feasible_budget(chain, "selective"), store_all_budget(chain)
    for i in reversed(range(budgets)):
        schedule = solve(chain, low + (high - low) * i // max(budgets - 1, 1), "selective")
        apply_schedule(work.model, schedule)
        try:
            work.forward().backward()  # warm-up
            peak = step_peak_bytes(work, state)
        finally:
            remove_schedule(work.model)
        print(f"  budget {format_bytes(schedule.budget_bytes):>11}: step peak {format_bytes(peak):>11} "
              f"({peak / plain_peak:.2f}x), loss option {_loss_option(schedule)}", flush=True)
        if peak <= TARGET_PEAK * plain_peak:
            return schedule, peak
    return None


def _loss_option(schedule: Schedule) -> str:
    """The name of the option the schedule's loss stage (stage L + 1) runs with, "as written" for none."""
    top = schedule.chain.length + 1
    chosen = [op.option for op in schedule.ops if op.stage == top and op.option]
    return schedule.chain.stage(top).options[chosen[0] - 1].name if chosen else "as written"


def alternate(work: Workload, schedule: Schedule, rounds: int) -> tuple[list[float], list[float]]:
    """Per-round step times (ms) of plain autograd and of ``schedule``, in turn, the order swapped each round."""
    from planner.executor import apply_schedule, remove_schedule

    plain_ms: list[float] = []
    planned_ms: list[float] = []
    for r in range(rounds):
        for planned in ((False, True) if r % 2 == 0 else (True, False)):
            if planned:
                apply_schedule(work.model, schedule)
                try:
                    planned_ms.append(one_step_ms(work.forward))
                finally:
                    remove_schedule(work.model)
            else:
                plain_ms.append(one_step_ms(work.forward))
            work.model.zero_grad(set_to_none=False)
    return plain_ms, planned_ms


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="steps of each, alternated")
    parser.add_argument("--budgets", type=int, default=8, help="activations budgets tried, from store-all's down")
    parser.add_argument("--quick", action="store_true", help="a 32k vocabulary, 2 layers (smoke run)")
    args = parser.parse_args(argv)
    layers, width, heads, vocab, batch, seq = SIZES["llama"][int(args.quick)]
    work = build_llama(layers, width, heads, batch, seq, vocab)
    started = time.perf_counter()
    work.forward().backward()  # every parameter gradient allocated, as in every later step
    state = state_bytes(work.model)
    work.model.zero_grad(set_to_none=False)
    plain_peak = step_peak_bytes(work, state)
    print(f"Llama {layers} layers x {width}, vocabulary {vocab:,}, batch {batch} x {seq}; store-all step peak "
          f"{format_bytes(plain_peak)}", flush=True)
    picked = pick_schedule(work, args.budgets, state, plain_peak)
    if picked is None:
        text = f"no selective schedule reached {TARGET_PEAK}x of store-all's step peak"
        print(text)
        return text
    schedule, peak = picked
    plain_ms, planned_ms = alternate(work, schedule, args.rounds)
    ratios = sorted(b / a for a, b in zip(plain_ms, planned_ms))
    ratio = statistics.median(ratios)
    verdict = "met" if ratio <= TARGET_TIME and peak <= TARGET_PEAK * plain_peak else "missed"
    text = "\n".join([
        f"- Date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC; load average at the end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{time.perf_counter() - started:.0f} s",
        f"- Model: Llama-style, {layers} layers x {width}, vocabulary {vocab:,}, batch {batch} x {seq}, fp32",
        f"- Schedule: selective at {format_bytes(schedule.budget_bytes)} (activations), loss option "
        f"{_loss_option(schedule)}", "",
        "| | step peak | x store-all | step ms (median of rounds) |",
        "|---|---:|---:|---:|",
        f"| store all | {format_bytes(plain_peak)} | 1.00x | {statistics.median(plain_ms):.0f} |",
        f"| planned | {format_bytes(peak)} | {peak / plain_peak:.2f}x | {statistics.median(planned_ms):.0f} |", "",
        f"Step time, planned over store-all, median of {len(ratios)} alternated rounds: {ratio:.3f}x "
        f"(rounds {ratios[0]:.3f}x-{ratios[-1]:.3f}x; quartiles {ratios[len(ratios) // 4]:.3f}x-"
        f"{ratios[3 * len(ratios) // 4]:.3f}x). Target: step peak <= {TARGET_PEAK}x, time <= {TARGET_TIME:.2f}x: "
        f"{verdict}.",
    ])
    print(text)
    return text


if __name__ == "__main__":
    main()
