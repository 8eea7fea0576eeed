"""Does memprof's background worker slow the training step beside it?

Run ``python -m benchmarks.bench_worker [--cycles N]``. One profiled run per model (the models of
:mod:`benchmarks.bench_profiler`): after a warm-up, the worker is stopped (SIGSTOP) for six steps
and let go on (SIGCONT) for six, over and over. While it runs it catches up on the records of the
stopped phase too, so it works at about twice its usual load. The ratio of the median step while it
runs over the median while it is stopped is its cost to the training thread, at double load;
alternating every few steps inside one run, rather than comparing runs, keeps the machine's slow
and fast spells on both sides alike. POSIX only (signals).

The training process waits for a worker that falls more than ``memprof.capture.sinks.MAX_PENDING`` records
behind; a stopped worker would so stop training (and be given up after two minutes), so that bound is lifted for
the measurement. ``--threads 0`` keeps torch's default intra-op threads, where training leaves the worker no idle
core.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import torch

from benchmarks.bench_profiler import MODELS, ModelSpec, steady_malloc
from examples import zoo
from memprof import MemoryProfiler
from memprof.capture import sinks

PHASE_STEPS = 6  # steps per phase; the first of each is not counted (the switch itself)
WARMUP_STEPS = 10


def measure(spec: ModelSpec, cycles: int, out_dir: str) -> tuple[float, float]:
    """Median step (ms) with the worker stopped and with it running, over ``cycles`` alternations."""
    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = make_batch(spec.batch_size)
    profiler = MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0)
    steps: dict[bool, list[float]] = {False: [], True: []}
    bound, sinks.MAX_PENDING = sinks.MAX_PENDING, 1 << 30  # a stopped worker must not hold training up
    try:
        for _ in range(WARMUP_STEPS):
            zoo.train_step(model, optimizer, batch)
            profiler.record_stats()
        pid = getattr(profiler._sink, "pid", None)  # the background sink's worker (None: inline)
        if pid is None:
            raise RuntimeError("memprof's worker did not start")
        for _ in range(cycles):
            for running in (False, True):
                os.kill(pid, signal.SIGCONT if running else signal.SIGSTOP)
                for i in range(PHASE_STEPS):
                    start = time.perf_counter()
                    zoo.train_step(model, optimizer, batch)
                    profiler.record_stats()
                    if i:
                        steps[running].append((time.perf_counter() - start) * 1e3)
        os.kill(pid, signal.SIGCONT)
    finally:
        sinks.MAX_PENDING = bound
        profiler.close()
    return statistics.median(steps[False]), statistics.median(steps[True])


def main(argv: Sequence[str] | None = None) -> str:
    """Runs the measurement and returns it as a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20, help="stop/go alternations per model (default 20)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default, all cores; default 1)")
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    malloc = steady_malloc()
    lines = ["# Background worker's cost to the training step", "",
             f"- Date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
             f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s); malloc: {malloc}",
             f"- Command: `python -m benchmarks.bench_worker --cycles {args.cycles} --threads {args.threads}`", "",
             "| Model | Step, worker stopped (ms) | Step, worker running at ~2x load (ms) | Ratio |",
             "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as out_dir:
        for spec in MODELS:
            stopped, running = measure(spec, args.cycles, out_dir)
            lines.append(f"| {spec.name} | {stopped:.2f} | {running:.2f} | {running / stopped:.3f}x |")
            print(f"{spec.name} done", file=sys.stderr, flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
