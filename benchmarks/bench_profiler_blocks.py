"""memprof's wall-clock cost with every step counted: blocks of steps alternating in one process.

Run ``python -m benchmarks.bench_profiler_blocks [--model transformer] [--blocks 16] [--steps 40] [--threads 0]
[--tools "memprof,memprof (worker nice 0)"]``. One model instance per configuration (the baseline, each memprof
variant of :mod:`benchmarks.bench_profiler`, and two controls: a second baseline on its own model instance, and
memprof's native allocator reporter alone), all in this process; every block runs each configuration in turn
(:func:`benchmarks.bench_profiler.run_block`: its profiler started, ``--warmup`` steps not counted, then ``--steps``
timed ones, then closed), in an order rotated from block to block. A configuration's block costs the mean of its
timed steps, ``train_step`` and ``record_stats()`` both; its ratio is the median over blocks of its block's mean over the baseline's mean in the
same block, so a slow spell of the machine falls on both sides of a ratio. Also reported: the time inside
``train_step`` alone (the hooks, the worker's interference) and the per-iteration call's median and mean (the
mean includes the waits for a worker that fell :data:`memprof.capture.sinks.MAX_PENDING` records behind).
Printed only: :mod:`benchmarks.bench_profiler` writes the docs' table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from benchmarks.bench_profiler import (
    EXTRA_TOOLS,
    MODELS,
    TOOLS,
    WARMUP_STEPS,
    Lane,
    Memprof,
    SecondBaseline,
    Tool,
    make_lane,
    run_block,
    steady_malloc,
)
from memprof.capture.native.stream import NativeAllocationStream


class ReporterOnly(Tool):
    """memprof's native allocator reporter alone, drained after every step: no hooks, no analysis, no worker."""

    name = "reporter only"

    def __init__(self) -> None:
        self._stream: NativeAllocationStream | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        self._stream = NativeAllocationStream(torch.device("cpu"))
        self._stream.start()

    def after_step(self) -> None:
        if self._stream is not None:
            self._stream.collect()

    def stop(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()


CONTROLS: tuple[type[Tool], ...] = (SecondBaseline, ReporterOnly)


def block_figures(lane: Lane, steps: int) -> tuple[list[float], list[float]]:
    """Per block of ``lane`` (as :func:`benchmarks.bench_profiler.run_block` recorded it): its mean step and its
    mean ``train_step`` alone (the step less the per-iteration call), in ms."""
    means = [statistics.fmean(block) for block in lane.wall_ms]
    calls = [statistics.fmean(lane.call_ms[k * steps:(k + 1) * steps]) for k in range(len(lane.wall_ms))]
    return means, [mean - call for mean, call in zip(means, calls)]


def report(names: Sequence[str], means: dict[str, list[float]], trains: dict[str, list[float]],
           calls: dict[str, list[float]]) -> list[str]:
    """One line per configuration: its block ratio (median, quartiles), train_step, and the call's median/mean."""
    base = means[names[0]]
    lines = [f"{names[0]}: mean step {statistics.median(base):.2f} ms (median of blocks), "
             f"train_step {statistics.median(trains[names[0]]):.2f} ms"]
    for name in names[1:]:
        ratios = [mine / theirs for mine, theirs in zip(means[name], base)]
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        lines.append(f"{name}: {statistics.median(ratios):.3f}x (quartiles {low:.3f}-{high:.3f}), mean step "
                     f"{statistics.median(means[name]):.2f} ms, train_step {statistics.median(trains[name]):.2f} "
                     f"ms, call median {statistics.median(calls[name]):.2f} ms, mean "
                     f"{statistics.fmean(calls[name]):.2f} ms")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the blocks and prints the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=[m.name for m in MODELS])
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per configuration per block")
    parser.add_argument("--warmup", type=int, default=WARMUP_STEPS)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    parser.add_argument("--tools", default=Memprof.name,
                        help="comma-separated memprof variants of bench_profiler, and the controls "
                             + ", ".join(repr(tool.name) for tool in CONTROLS))
    args = parser.parse_args(argv)
    if min(args.blocks, args.steps) < 1 or args.warmup < 0:
        parser.error("--blocks and --steps must be at least 1, --warmup at least 0")
    variants = [tool for tool in TOOLS + EXTRA_TOOLS if issubclass(tool, Memprof)]
    known = {tool.name: tool for tool in (*variants, *CONTROLS)}
    unknown = [name for name in args.tools.split(",") if name not in known]
    if unknown:
        parser.error(f"--tools: unknown {unknown}; one of {sorted(known)}")
    print(steady_malloc())
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = next(m for m in MODELS if m.name == args.model)
    lanes = {"baseline": make_lane(spec, Tool())} | {name: make_lane(spec, known[name]()) for name in
                                                      args.tools.split(",")}
    names = list(lanes)
    with tempfile.TemporaryDirectory(prefix="memprof-blocks-") as tmp:
        for block in range(args.blocks):
            shift = block % len(names)
            for name in names[shift:] + names[:shift]:
                run_block(lanes[name], args.warmup, args.steps, Path(tmp) / name)
                if lanes[name].error is not None:
                    raise SystemExit(f"{name}: {lanes[name].error}")
    figures = {name: block_figures(lane, args.steps) for name, lane in lanes.items()}
    means = {name: found[0] for name, found in figures.items()}
    trains = {name: found[1] for name, found in figures.items()}
    calls = {name: lane.call_ms for name, lane in lanes.items()}
    print("\n".join(report(names, means, trains, calls)))


if __name__ == "__main__":
    main()
