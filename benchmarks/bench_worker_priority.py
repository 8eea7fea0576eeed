"""Which scheduling priority should memprof's background worker run at? Measured inside one profiled run.

Run ``python -m benchmarks.bench_worker_priority [--model transformer] [--threads 0] [--cycles 10]`` (Linux, and as
root or with CAP_SYS_NICE: the benchmark moves its worker between priorities, which an unprivileged process can do
only one way). One model, one profiler; after a warm-up, every cycle runs a segment of steps at each priority of
``--priorities`` (``idle``: SCHED_IDLE; ``nice<n>``), in an order rotated from cycle to cycle, and a segment of
the same model's steps without memprof (a second instance, no hooks). A segment's first ``--settle`` steps are not
counted: they absorb the backlog the previous priority left. Alternating inside one run, rather than comparing
runs, keeps the machine's slow and fast spells on every side alike and the model's memory layout the same.

Per priority: the median step's wall clock and CPU time (the training process, all threads), the worker's CPU per
step (``/proc/<pid>/task/*/schedstat``), and ``record_stats()``'s wall clock (it waits when the worker is 16
records behind).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from benchmarks.bench_profiler import DEFAULT_THREADS, MODELS, steady_malloc, worker_cpu_s
from examples import zoo
from memprof import MemoryProfiler


@dataclass
class Lane:
    """What one priority's segments measured."""

    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)
    worker_ms: list[float] = field(default_factory=list)  # per step, one value per segment


def set_priority(pid: int, priority: str) -> None:
    """Puts process ``pid`` at ``idle`` (SCHED_IDLE) or ``nice<n>`` (SCHED_OTHER at niceness n)."""
    if priority == "idle":
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, pid, int(priority.removeprefix("nice")))


def timed_step(step: Callable[[], object], lane: Lane, call: Callable[[], object] | None = None) -> None:
    """One training step (and the profiler's call), its wall clock and CPU time added to ``lane``."""
    start_s, cpu_s = time.perf_counter(), time.process_time()
    step()
    called_s = time.perf_counter()
    if call is not None:
        call()
        lane.call_ms.append((time.perf_counter() - called_s) * 1e3)
    lane.wall_ms.append((time.perf_counter() - start_s) * 1e3)
    lane.cpu_ms.append((time.process_time() - cpu_s) * 1e3)


def measure(args: argparse.Namespace) -> dict[str, Lane]:
    """Every priority's lane, and ``"none"``: the bare model's steps."""
    spec = next(m for m in MODELS if m.name == args.model)
    models = []
    for _ in range(2):  # the profiled model, and the bare one
        torch.manual_seed(0)
        model, make_batch = spec.build()
        models.append((model, torch.optim.Adam(model.parameters(), lr=1e-4), make_batch(spec.batch_size)))
    priorities = args.priorities.split(",")
    lanes = {name: Lane() for name in ["none", *priorities]}
    counted = args.segment - args.settle
    with tempfile.TemporaryDirectory(prefix="memprof-priority-") as tmp:
        profiler = MemoryProfiler(models[0][0], models[0][1], out_dir=tmp, print_period=0)
        profiled, bare = partial(zoo.train_step, *models[0]), partial(zoo.train_step, *models[1])
        for _ in range(args.warmup):
            profiled()
            profiler.record_stats()
        pid = getattr(profiler._sink, "pid", None)
        if pid is None:
            raise SystemExit("memprof's worker did not start")
        for cycle in range(args.cycles):
            for _ in range(counted):
                timed_step(bare, lanes["none"])
            for priority in priorities[cycle % len(priorities):] + priorities[:cycle % len(priorities)]:
                set_priority(pid, priority)
                for i in range(args.segment):
                    if i == args.settle:
                        worker_start = worker_cpu_s(pid) or 0.0
                    if i < args.settle:
                        profiled()
                        profiler.record_stats()
                    else:
                        timed_step(profiled, lanes[priority], profiler.record_stats)
                lanes[priority].worker_ms.append(((worker_cpu_s(pid) or 0.0) - worker_start) * 1e3 / counted)
            print(f"cycle {cycle + 1}/{args.cycles} done", file=sys.stderr, flush=True)
        profiler.close()
    return lanes


def report(lanes: dict[str, Lane], args: argparse.Namespace) -> str:
    """The Markdown table: per priority, its medians and their ratios to the bare step."""
    base = lanes["none"]
    wall0, cpu0 = statistics.median(base.wall_ms), statistics.median(base.cpu_ms)
    lines = [f"- Model {args.model}, {args.threads} intra-op threads, {args.cycles} cycles x "
             f"{args.segment - args.settle} counted steps per priority; load average at the end "
             + ", ".join(f"{x:.2f}" for x in os.getloadavg()), "",
             "| Worker priority | Median step (ms) | Step CPU (ms) | Worker CPU (ms/step) | CPU with the worker | "
             "`record_stats()` (ms) |", "|---|---:|---:|---:|---:|---:|",
             f"| no memprof | {wall0:.2f} | {cpu0:.2f} | | | |"]
    for name, lane in lanes.items():
        if name == "none":
            continue
        wall, cpu, worker = (statistics.median(lane.wall_ms), statistics.median(lane.cpu_ms),
                             statistics.mean(lane.worker_ms))
        lines.append(f"| {name} | {wall:.2f} ({wall / wall0:.2f}x) | {cpu:.2f} | {worker:.2f} | "
                     f"{(cpu + worker) / cpu0:.2f}x | {statistics.median(lane.call_ms):.2f} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=[m.name for m in MODELS])
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--segment", type=int, default=40, help="steps per priority per cycle")
    parser.add_argument("--settle", type=int, default=16, help="uncounted steps at a segment's start")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--priorities", default="idle,nice0,nice10,nice19")
    args = parser.parse_args(argv)
    args.threads = args.threads or DEFAULT_THREADS
    if not 0 <= args.settle < args.segment:
        parser.error("--settle must be below --segment")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the comparison and prints its table."""
    args = parse_args(argv)
    steady_malloc()
    torch.set_num_threads(args.threads)
    print(report(measure(args), args))


if __name__ == "__main__":
    main()
