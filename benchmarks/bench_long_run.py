"""Long runs: trace size, file count, ``record_stats()`` cost, load time and the profiler's memory over 100,000 steps.

Run ``python -m benchmarks.bench_long_run [--model small|deep] [--iterations 1000 10000 100000]``. One profiled
run with the default detail policy; at each checkpoint (training paused between two steps) it reports the run
directory's bytes and files (journal included: what is on disk at that moment), the mean wall time of
``record_stats()`` on the training thread over the steps since the last checkpoint, the time to open the trace
and read its summary (``load_trace(run).iterations``) and one detailed iteration's timeline (in a child process,
as a notebook beside the run would), and the resident memory of the training process and of the background
worker.

``--costs`` instead compares ``record_stats()`` with detail for every iteration (what every iteration cost before
the detail policy) against the default policy, both lanes in one process, alternating, median of ``--repeats``
runs of ``--steps`` steps each; inline (``background=False``: ``record_stats()`` analyses and writes) and
background (the worker analyses and writes; its CPU time per step is reported beside).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.detail import DetailPolicy

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def small() -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A small fast model: 2 residual MLP blocks of width 32 (about 10 modules)."""
    return zoo.mlp(blocks=2, width=32)


def deep() -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A 100-layer model: 50 Linear + ReLU pairs of width 32 in one Sequential (101 modules with the root)."""
    layers: list[nn.Module] = []
    for _ in range(50):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers[:-1], nn.Linear(32, 4))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 32), torch.randint(0, 4, (n,))

    return model, make_batch


MODELS = {"small": small, "deep": deep}


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), from /proc."""
    with open(f"/proc/{pid or 'self'}/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk(run_dir: Path) -> tuple[int, int]:
    """Bytes and files under a run directory."""
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def wait_for_worker(profiler: MemoryProfiler, timeout_s: float = 120.0) -> None:
    """Waits until the background worker has answered every record (so its tables are on disk)."""
    sink = profiler._sink
    deadline = time.monotonic() + timeout_s
    while getattr(sink, "_answered", 0) < getattr(sink, "_submitted", 0) and time.monotonic() < deadline:
        profiler._handle(sink._read(block=True))  # type: ignore[union-attr]


def long_run(model_name: str, checkpoints: Sequence[int], out_dir: Path) -> list[dict[str, float]]:
    """One profiled run to the last checkpoint; a row of measurements at each."""
    torch.manual_seed(0)
    model, make_batch = MODELS[model_name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = make_batch(8)
    rows = []
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id="long", print_period=0) as profiler:
        done, spent_ns = 0, 0
        for checkpoint in checkpoints:
            started = done
            while done < checkpoint:
                zoo.train_step(model, optimizer, batch)
                t0 = time.perf_counter_ns()
                profiler.record_stats()
                spent_ns += time.perf_counter_ns() - t0
                done += 1
            wait_for_worker(profiler)
            rows.append(measure(profiler, done, spent_ns / max(done - started, 1) / 1e3))
            spent_ns = 0
            print(f"  {model_name}: {done} iterations measured", flush=True)
    return rows


_READ_SCRIPT = """
import json, sys, time
from memprof import load_trace
t0 = time.perf_counter()
trace = load_trace(sys.argv[1])
rows = len(trace.iterations)
t1 = time.perf_counter()
timeline = trace.read("events", iterations=[trace.detail_iterations[-1]])
t2 = time.perf_counter()
print(json.dumps({"rows": rows, "events": len(timeline), "detailed": len(trace.detail_iterations),
                  "load_s": t1 - t0, "detail_s": t2 - t1}))
"""


def measure(profiler: MemoryProfiler, done: int, record_us: float) -> dict[str, float]:
    """The checkpoint's row: disk, files, record_stats() cost, load times, memory.

    The trace is read in a child process (as a user's notebook would), so the training process's
    memory shows what the profiler holds, not what reading the trace left in its allocators.
    """
    nbytes, files = disk(profiler.run_dir)
    worker = getattr(profiler._sink, "pid", None)
    rss, worker_rss = rss_bytes(), rss_bytes(worker) if worker else 0
    read = subprocess.run([sys.executable, "-c", _READ_SCRIPT, str(profiler.run_dir)], check=True,
                          capture_output=True, text=True)
    timings = json.loads(read.stdout)
    assert timings["rows"] == done and timings["events"] > 0
    return {"iterations": done, "detailed": timings["detailed"], "bytes": nbytes, "files": files,
            "record_us": record_us, "load_s": timings["load_s"], "detail_s": timings["detail_s"], "rss": rss,
            "worker_rss": worker_rss}


def growth_table(model_name: str, rows: list[dict[str, float]]) -> str:
    """The checkpoints as a Markdown table."""
    lines = [f"Model `{model_name}`, default detail policy {DetailPolicy().to_json()}:", "",
             "| iterations | detailed | trace size | files | record_stats() mean | load + summary | one timeline "
             "| training RSS | worker RSS |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['iterations']:,} | {r['detailed']:,} | {r['bytes'] / 2**20:.2f} MiB | {r['files']} | "
                     f"{r['record_us']:.0f} µs | {r['load_s'] * 1e3:.0f} ms | {r['detail_s'] * 1e3:.0f} ms | "
                     f"{r['rss'] / 2**20:.0f} MiB | {r['worker_rss'] / 2**20:.0f} MiB |")
    return "\n".join(lines)


def cost_lane(model_name: str, steps: int, background: bool, everything: bool, out_dir: Path) -> tuple[float, float]:
    """Median ``record_stats()`` wall µs, and the worker's CPU µs per step (0 inline), over ``steps`` steps."""
    torch.manual_seed(0)
    model, make_batch = MODELS[model_name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = make_batch(8)
    policy = DetailPolicy.everything() if everything else DetailPolicy()
    times = []
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=background,
                        detail_first=policy.first, detail_every=policy.every) as profiler:
        for _ in range(20):  # warm-up, and the default policy's first detailed iterations
            zoo.train_step(model, optimizer, batch)
            profiler.record_stats()
        wait_for_worker(profiler)
        worker = getattr(profiler._sink, "pid", None) if background else None
        cpu0 = cpu_s(worker) if worker else 0.0
        for _ in range(steps):
            zoo.train_step(model, optimizer, batch)
            t0 = time.perf_counter_ns()
            profiler.record_stats()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        wait_for_worker(profiler)
        worker_us = (cpu_s(worker) - cpu0) / steps * 1e6 if worker else 0.0
    return statistics.median(times), worker_us


def cost_table(model_name: str, steps: int, repeats: int, out_dir: Path) -> str:
    """Detail for every iteration against the default policy, alternating lanes, medians over repeats."""
    lanes = [(bg, every) for bg in (False, True) for every in (True, False)]
    results: dict[tuple[bool, bool], list[tuple[float, float]]] = {lane: [] for lane in lanes}
    for repeat in range(repeats):
        for lane in lanes:
            results[lane].append(cost_lane(model_name, steps, *lane, out_dir / f"r{repeat}-{lane}"))
    lines = [f"Model `{model_name}`, {steps} steps per run after 20 warm-up steps, median of {repeats} runs:", "",
             "| processing | detail | record_stats() median | worker CPU per step |",
             "| --- | --- | ---: | ---: |"]
    for (background, everything), values in results.items():
        record = statistics.median(v[0] for v in values)
        worker = statistics.median(v[1] for v in values)
        lines.append(f"| {'background' if background else 'inline'} | "
                     f"{'every iteration' if everything else 'default policy'} | {record:.0f} µs | "
                     + (f"{worker:.0f} µs |" if background else "- |"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), nargs="+", default=["small"])
    parser.add_argument("--iterations", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--costs", action="store_true", help="compare record_stats() with and without detail")
    parser.add_argument("--steps", type=int, default=500, help="steps per run with --costs")
    parser.add_argument("--repeats", type=int, default=3, help="runs per lane with --costs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model:
            if args.costs:
                print(cost_table(name, args.steps, args.repeats, Path(tmp) / name))
            else:
                print(growth_table(name, long_run(name, sorted(args.iterations), Path(tmp) / name)))
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
