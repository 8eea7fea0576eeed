"""A long run's ``iterations`` table with and without compaction: files, bytes, write time, read time.

Run ``python -m benchmarks.bench_compaction [--iterations N] [--flush K]``. Synthetic ``iterations``
rows (the schema's 20 columns, values varying as a real run's do) are appended ``K`` at a time, as the
background worker flushes them, through :class:`memprof.trace.format.writer.TraceWriter`: once compacting
after every flush (the default policy, as ``write_iterations`` does), once never compacting (one part
per flush). Write time is the time spent in ``append`` and ``compact``, rows already built; read
time is ``load_run(run).iterations`` in a fresh process-warm state (footers and data both read).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from memprof.schema import ITERATIONS, SCHEMAS
from memprof.trace.format.compaction import FAN_IN, MAX_MERGE_BYTES, MAX_MERGE_ROWS
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.trace.reader import load_run, table_parts
from memprof.units import format_bytes

PHASES = np.array(["forward", "backward", "optimizer", "other"])
MODULES = np.array([f"layers.{i}.{part}" for i in range(24) for part in ("attn", "mlp", "norm")])


def iterations_rows(first: int, count: int, rng: np.random.Generator) -> pa.Table:
    """``count`` iterations rows from ``first``, with the spread of values a training run has."""
    arrays = []
    for f in SCHEMAS[ITERATIONS]:
        if f.name == "iteration":
            values: object = np.arange(first, first + count, dtype=np.int64)
        elif f.name == "epoch":
            values = np.arange(first, first + count, dtype=np.int64) // 1000
        elif f.name == "detail":
            values = np.arange(first, first + count) % 100 == 0
        elif f.name == "peak_phase":
            values = PHASES[rng.integers(0, len(PHASES), count)]
        elif f.name == "peak_module":
            values = MODULES[rng.integers(0, len(MODULES), count)]
        elif pa.types.is_floating(f.type):
            values = rng.normal(50.0, 5.0, count)
        else:
            values = rng.integers(1 << 20, 1 << 32, count, dtype=np.int64)
        arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMAS[ITERATIONS])


def measure(run_dir: Path, iterations: int, flush: int, compact: bool) -> dict[str, float]:
    """Writes the run; returns files, bytes, write and merge seconds, and the read time."""
    rng = np.random.default_rng(0)
    writer = TraceWriter(run_dir)
    write_meta(run_dir, {"format": "memprof-trace", "schema_version": 2, "run_id": "bench", "created_at": "",
                         "device": "cpu", "torch_version": "", "model": "synthetic", "rank": 0, "world_size": 1})
    write_s = merge_s = 0.0
    for first in range(0, iterations, flush):
        rows = iterations_rows(first, min(flush, iterations - first), rng)
        start = time.perf_counter()
        writer.append(ITERATIONS, rows)
        middle = time.perf_counter()
        if compact:
            writer.compact()
        merge_s += time.perf_counter() - middle
        write_s += middle - start
    parts = table_parts(run_dir, ITERATIONS)
    start = time.perf_counter()
    frame = load_run(run_dir).iterations
    read_s = time.perf_counter() - start
    assert frame.iteration.tolist() == list(range(iterations))
    start = time.perf_counter()
    one = load_run(run_dir).read(ITERATIONS, iterations=[iterations // 2])
    one_s = time.perf_counter() - start
    assert len(one) == 1
    return {"files": len(parts), "bytes": sum(p.stat().st_size for p in parts), "write_s": write_s,
            "merge_s": merge_s, "read_s": read_s, "one_s": one_s}


def _levels(appended: int) -> int:
    """floor(log_F N) + 1, in integers."""
    count = 0
    while appended >= FAN_IN ** count:
        count += 1
    return count


def main(argv: Sequence[str] | None = None) -> str:
    """Runs both configurations and returns the Markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--flush", type=int, default=16, help="iterations per flush (the worker's 16)")
    args = parser.parse_args(argv)
    flushes = -(-args.iterations // args.flush)
    lines = ["# Trace compaction over a long run", "",
             f"- Date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
             f"pyarrow {pa.__version__}",
             f"- Command: `python -m benchmarks.bench_compaction --iterations {args.iterations} "
             f"--flush {args.flush}`",
             f"- {args.iterations:,} synthetic `iterations` rows ({len(SCHEMAS[ITERATIONS])} columns) in "
             f"{flushes:,} flushes of {args.flush}; policy F = {FAN_IN}, caps {MAX_MERGE_ROWS:,} rows / "
             f"{format_bytes(MAX_MERGE_BYTES)} per merge; bound on the parts of a table below the caps "
             f"(docs/trace-format.md): (F - 1) * (floor(log_F N) + 1) = {(FAN_IN - 1) * _levels(flushes)} "
             f"for N = {flushes:,}", "",
             "| Parts | Files | Bytes | Write (s) | of which merging (s) | `load_run(run).iterations` (ms) "
             "| `read(iterations=[k])` (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for compact in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            m = measure(Path(tmp) / "run", args.iterations, args.flush, compact)
        label = "compacted" if compact else "one per flush"
        lines.append(f"| {label} | {m['files']:,} | {format_bytes(int(m['bytes']))} | "
                     f"{m['write_s'] + m['merge_s']:.1f} | {m['merge_s']:.1f} | {m['read_s'] * 1e3:.0f} | "
                     f"{m['one_s'] * 1e3:.0f} |")
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
