"""Solver speed: the rotor DP against chain length and slots, and the budget slider's ``schedule_at``.

Run ``python -m benchmarks.bench_solver`` (``--help`` for options). Chains are random but seeded: sizes
of 1-50 MiB per activation, a-bar up to 30 MiB more, overheads up to 20/60 MiB, times of 1-20 ms. Each
timing is the median of ``--repeats`` runs, wall clock and CPU time of this process (on a shared
machine the CPU time is the steadier of the two; the load average is printed). Table memory is the
cost table the DP keeps; the peak is what NumPy allocated at most while filling it (tracemalloc).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import tracemalloc
from collections.abc import Sequence

from planner.fronts.pareto import pareto_front
from planner.model.chain import Chain, Stage
from planner.solvers.rotor import compute_table

MIB = 2**20


def random_chain(length: int, seed: int = 0) -> Chain:
    """A reproducible chain of ``length`` stages plus the loss."""
    rng = random.Random(seed)
    stages = []
    for _ in range(length + 1):
        output = rng.randint(1, 50) * MIB
        stages.append(Stage(
            forward_ms=rng.uniform(1, 10),
            backward_ms=rng.uniform(2, 20),
            output_bytes=output,
            saved_bytes=output + rng.randint(0, 30) * MIB,
            grad_bytes=output,
            forward_overhead_bytes=rng.randint(0, 20) * MIB,
            backward_overhead_bytes=rng.randint(0, 60) * MIB,
        ))
    return Chain(f"random-{length}", rng.randint(1, 50) * MIB, tuple(stages))


def time_dp(chain: Chain, slots: int, repeats: int) -> dict[str, float]:
    """Median wall and CPU seconds of ``compute_table``, its table size and allocation peak (MiB)."""
    walls, cpus = [], []
    table = None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        table = compute_table(chain, slots)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    assert table is not None
    table_mib = table.table_bytes / MIB
    del table
    tracemalloc.start()
    compute_table(chain, slots)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "table_mib": table_mib,
            "peak_mib": peak / MIB}


def time_slider(chain: Chain, slots: int, points: int) -> dict[str, float]:
    """Median and worst milliseconds of ``ParetoFront.schedule_at`` over evenly spaced budgets."""
    front = pareto_front(chain, "rotor", slots)
    step = (front.max_budget_bytes - front.min_feasible_bytes) / max(points - 1, 1)
    times = []
    for index in range(points):
        budget = int(front.min_feasible_bytes + index * step)
        start = time.perf_counter()
        front.schedule_at(budget)
        times.append((time.perf_counter() - start) * 1000)
    return {"median_ms": statistics.median(times), "max_ms": max(times), "points": float(len(front.budgets_bytes))}


def main(argv: Sequence[str] | None = None) -> None:
    """Prints Markdown tables of the measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 100, 339])
    parser.add_argument("--slots", type=int, default=500)
    parser.add_argument("--slot-sweep", type=int, nargs="*", default=[125, 250, 1000], help="extra slot counts at L=100")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slider-points", type=int, default=25)
    args = parser.parse_args(argv)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs\n")
    print("| stages L | slots | DP wall (median) | DP CPU (median) | table | peak allocated |")
    print("|---:|---:|---:|---:|---:|---:|")
    runs = [(length, args.slots) for length in args.lengths] + [(100, slots) for slots in args.slot_sweep]
    for length, slots in runs:
        repeats = args.repeats if length <= 150 else max(1, args.repeats // 2 + 1)
        result = time_dp(random_chain(length, seed=length), slots, repeats)
        print(f"| {length} | {slots} | {result['wall_s']:.3f} s | {result['cpu_s']:.3f} s | "
              f"{result['table_mib']:.1f} MiB | {result['peak_mib']:.1f} MiB |")
    print("\n| stages L | slots | schedule_at median | schedule_at max | distinct optima |")
    print("|---:|---:|---:|---:|---:|")
    for length in (100,):
        result = time_slider(random_chain(length, seed=length), args.slots, args.slider_points)
        print(f"| {length} | {args.slots} | {result['median_ms']:.1f} ms | {result['max_ms']:.1f} ms | "
              f"{int(result['points'])} |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
