"""Binomial checkpointing: solve time on very long chains, Griewank's counts, and rotor against it at equal memory.

Run ``python -m benchmarks.bench_binomial`` (``--help`` for options). Chains are those of
``bench_solver`` (seeded random sizes of 1-50 MiB per activation, times of 1-20 ms), and uniform chains
(every stage 1 MiB, 1 ms forward, 2 ms backward) for the counts. The budget of the long chains is the one
that fits 10 snapshots by binomial's size bound. Solve times are ``solve(chain, budget, "binomial")``
end to end -- choosing the snapshots, building the ops and ``solve``'s own simulation of them -- median
of ``--repeats`` runs, wall clock and CPU time of this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.bench_solver import random_chain
from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain, Stage
from planner.model.schedule import OpKind
from planner.simulation.simulator import predict
from planner.solvers.binomial import bisection_ops, memory_bounds
from planner.solvers.binomial_split import binomial_ops, forward_count
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget

MIB = 2**20
KNOWN_COUNTS = ((100, 10, 322), (1000, 10, 4636))  # steps, snapshots, forwards (advances + taped), published


def uniform_chain(length: int) -> Chain:
    """``length`` identical stages plus the loss."""
    stage = Stage(1.0, 2.0, MIB, MIB, MIB)
    return Chain(f"uniform-{length}", MIB, (stage,) * (length + 1))


def forwards(ops: Sequence) -> int:
    """F_ck + F_none + F_all."""
    return sum(op.kind is not OpKind.B for op in ops)


def time_solve(chain: Chain, budget: int, repeats: int) -> dict[str, float]:
    """Median wall/CPU seconds of ``solve(.., "binomial")`` and of its simulation alone; the schedule's figures."""
    walls, cpus, sims = [], [], []
    schedule = None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        schedule = solve(chain, budget, "binomial")
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        start = time.perf_counter()
        predict(chain, schedule.ops)
        sims.append(time.perf_counter() - start)
    assert schedule is not None
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "sim_s": statistics.median(sims),
            "ops": len(schedule.ops), "snapshots": schedule.params.snapshots, "forwards": forwards(schedule.ops),
            "optimum": forward_count(chain.length + 1, schedule.params.snapshots),
            "peak": schedule.predicted_peak_bytes or 0, "bound": schedule.params.bound_bytes}


def long_chains(lengths: list[int], repeats: int) -> None:
    print("| stages L | chain | snapshots | operations | forwards (optimum) | simulated peak / bound | "
          "solve wall (median) | solve CPU | of which simulation |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for length in lengths:
        for kind, chain in (("uniform", uniform_chain(length)), ("random", random_chain(length, seed=length))):
            budget = int(memory_bounds(chain)[10])
            r = time_solve(chain, budget, repeats)
            print(f"| {length:,} | {kind} | {r['snapshots']} | {r['ops']:,} | {r['forwards']:,} ({r['optimum']:,}) | "
                  f"{r['peak'] / MIB:,.0f} / {r['bound'] / MIB:,.0f} MiB | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | "
                  f"{r['sim_s']:.2f} s |")


def counts() -> None:
    print("\n| steps n | snapshots | forwards of the schedule | closed form | published | seed's bisection "
          "(its snapshots) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for steps, snapshots, published in KNOWN_COUNTS:
        length = steps - 1
        halves = bisection_ops(length)
        chain = uniform_chain(length)
        peak, _ = predict(chain, halves)
        held = int(np.searchsorted(memory_bounds(chain)[1:], peak)) + 1  # the bound is exact on a uniform chain
        print(f"| {steps:,} | {snapshots} | {forwards(binomial_ops(length, snapshots)):,} | "
              f"{forward_count(steps, snapshots):,} | {published:,} | {forwards(halves):,} ({held}) |")


def against_rotor(lengths: list[int], fractions: list[float]) -> None:
    print("\n| stages L | budget (of the way from the least to store-all) | rotor makespan | binomial makespan | "
          "binomial / rotor | binomial snapshots | rotor solve | binomial solve |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for length in lengths:
        chain = random_chain(length, seed=length)
        low = max(min_feasible_budget(chain, "rotor"), min_feasible_budget(chain, "binomial"))
        top = store_all_budget(chain)
        for fraction in fractions:
            budget = int(low + fraction * (top - low))
            start = time.perf_counter()
            rotor = solve(chain, budget, "rotor")
            rotor_s = time.perf_counter() - start
            start = time.perf_counter()
            try:
                found = solve(chain, budget, "binomial")
            except InfeasibleBudgetError:
                continue
            binomial_s = time.perf_counter() - start
            rotor_ms, binomial_ms = rotor.predicted_makespan_ms or 0.0, found.predicted_makespan_ms or 0.0
            print(f"| {length} | {budget / MIB:,.0f} MiB ({fraction:.0%}) | {rotor_ms:,.0f} ms | {binomial_ms:,.0f} ms | "
                  f"{binomial_ms / rotor_ms:.2f} | {found.params.snapshots or 'store-all'} | {rotor_s:.2f} s | "
                  f"{binomial_s:.3f} s |")


def main(argv: Sequence[str] | None = None) -> None:
    """Prints Markdown tables of the measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rotor-lengths", type=int, nargs="+", default=[50, 100, 200, 339])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5, 0.9])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs\n")
    long_chains(args.lengths, args.repeats)
    counts()
    against_rotor(args.rotor_lengths, args.fractions)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
