"""Many ranks: one streaming pass over a 64-rank run vs DuckDB vs loading every rank whole.

Run ``python -m benchmarks.bench_ranks [--ranks 64] [--iterations 100000] [--repeats 5]``.

A synthetic distributed run is written with memprof's writer: ``--ranks`` ranks, each an
``iterations`` table of ``--iterations`` rows in parts of ``--part-rows`` rows, plus ``layers``
rows for iterations 0, 500 and the last. The same run at a tenth of the iterations is written too,
to show how time and memory grow with the run. Each query then runs ``--repeats`` times in a fresh
process (after one warm-up query on a tiny run, which loads the libraries' code and starts their
threads); the table gives the median time and the process's peak resident memory during the runs
minus its resident memory before them (``VmHWM`` reset through ``/proc/self/clear_refs``; where that
is refused, ``ru_maxrss``, which counts the imports too). DuckDB runs the queries of
docs/trace-format.md ("Many ranks") as written, with its default threads.

Results are printed and written to ``benchmarks/results/ranks.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

RESULTS_PATH = Path(__file__).parent / "results" / "ranks.md"
VIEW_TARGET_S = 2.0
TARGET_RUN = (64, 100_000)  # ranks x iterations the view's target is set for
PEAK_COLUMNS = ["iteration", "peak_allocated_bytes", "peak_reserved_bytes"]
#: name -> (what the table calls it, the documented DuckDB question it runs, if any)
MEASURES: dict[str, tuple[str, str | None]] = {
    "summary": ("memprof `rank_summary` (one streaming pass)", None),
    "duckdb_summary": ("DuckDB: each rank's peak, where, when, iterations", "Each rank's peak: where"),
    "peaks": ("memprof `rank_peaks`, 2,000 points per rank", None),
    "view": ("dashboard ranks view, cold cache (scan + text + figure)", None),
    "duckdb_highest": ("DuckDB: which rank peaked highest", "Which rank peaked highest"),
    "duckdb_over_time": ("DuckDB: each rank's peak per 1,000 iterations", "Each rank's peak over time"),
    "duckdb_modules": ("DuckDB: top modules by saved bytes, one iteration", "The modules that save the most"),
    "load_all": ("before: every rank loaded whole with pandas, then grouped", None),
}


def _status_mib(key: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssProbe:
    """The growth of the process's peak resident memory over a stretch of work."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
                refs.write("5")  # resets VmHWM to the current resident size
            self.exact = _status_mib("VmHWM") is not None
        except OSError:
            self.exact = False
        self.before = _status_mib("VmRSS") or 0.0

    def growth_mib(self) -> float:
        peak = _status_mib("VmHWM") if self.exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return max(0.0, (peak or 0.0) - self.before)


def _query(name: str, run: Path) -> Callable[[], object]:
    """The work measured under ``name`` on ``run``."""
    if name in ("summary", "peaks"):
        from memprof.trace.ranks import rank_peaks, rank_summary

        return (lambda: rank_summary(run)) if name == "summary" else (lambda: rank_peaks(run, 2_000))
    if name == "view":
        from dashboard.cache import BoundedCache
        from dashboard.callbacks import ranks_view
        from dashboard.data import TraceStore

        return lambda: ranks_view(TraceStore(run.parent, BoundedCache()), [f"{run.name}/rank=0"])
    if name == "load_all":
        return lambda: _load_all(run)
    import duckdb

    from tests.memprof.trace.ranks.many_ranks import documented_queries

    question = MEASURES[name][1]
    sql = next(sql for title, (sql, _) in documented_queries().items() if title.startswith(str(question)))
    sql = sql.replace("<run>", str(run))
    return lambda: duckdb.sql(sql).fetchall()


def _load_all(run: Path) -> object:
    """What the ranks view did before the streaming pass: every rank's iterations in one frame."""
    import pandas as pd

    from memprof.schema import ITERATIONS
    from memprof.trace.reader import load_run

    frames = [load_run(run / f"rank={rank}").read(ITERATIONS, columns=PEAK_COLUMNS).assign(rank=rank)
              for rank in sorted(int(p.name.split("=")[1]) for p in run.glob("rank=*"))]
    frame = pd.concat(frames, ignore_index=True)
    return frame.groupby("rank")["peak_allocated_bytes"].max()


def measure(name: str, run: Path, warm: Path, repeats: int) -> dict:
    """Times ``repeats`` runs of one query in this process; returns the median, all times and the RSS growth."""
    _query(name, warm)()  # load code, start threads: the growth then is what the data costs
    work = _query(name, run)
    probe = RssProbe()
    seconds = []
    extra: dict = {}
    for _ in range(repeats):
        started = time.perf_counter()
        value = work()
        seconds.append(time.perf_counter() - started)
    if name == "view":
        extra["figure_kib"] = len(value[2].to_json()) / 1024  # type: ignore[index]
        extra["points"] = sum(len(trace.x) for trace in value[2].data)  # type: ignore[index]
    return {"median_s": statistics.median(seconds), "seconds": seconds, "rss_growth_mib": probe.growth_mib(),
            "rss_exact": probe.exact, **extra}


def _in_fresh_process(name: str, run: Path, warm: Path, repeats: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_ranks", "--measure", name, "--run", str(run),
               "--warm", str(warm), "--repeats", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_run(root: Path, ranks: int, iterations: int, part_rows: int) -> dict:
    """Writes the synthetic run; returns its size and how long writing took."""
    from tests.memprof.trace.ranks.many_ranks import write_many_ranks

    started = time.perf_counter()
    detailed = sorted({0, min(500, iterations - 1), iterations - 1})
    write_many_ranks(root, ranks, iterations, part_rows=part_rows, detailed=detailed)
    files = list(root.rglob("*.parquet"))
    return {"write_s": time.perf_counter() - started, "parts": len(list(root.glob("rank=*/iterations.parquet/*"))),
            "disk_mib": sum(f.stat().st_size for f in files if f.is_file()) / 2**20, "detailed": detailed}


def report(args: argparse.Namespace, sizes: list[int], runs: dict[int, dict], results: dict[int, dict]) -> str:
    """The Markdown report: setup, one table with a time and a memory column per run size, the target."""
    import duckdb
    import pyarrow

    big = max(sizes)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    exact = all(r["rss_exact"] for per in results.values() for r in per.values())
    lines = [
        "# Many ranks: one streaming pass vs DuckDB vs loading every rank",
        "",
        f"- Date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC; load average at the end "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Python {platform.python_version()}, "
        f"pyarrow {pyarrow.__version__}, DuckDB {duckdb.__version__}",
        f"- Command: `python -m benchmarks.bench_ranks --ranks {args.ranks} --iterations {big} "
        f"--part-rows {args.part_rows} --repeats {args.repeats}`",
    ]
    for size in sizes:
        run = runs[size]
        lines.append(f"- Run of {args.ranks} x {size:,} iterations: {args.ranks * size:,} `iterations` rows in "
                     f"{run['parts']} parts of up to {args.part_rows:,} rows, {run['disk_mib']:.0f} MiB on disk with "
                     f"layers for iterations {', '.join(map(str, run['detailed']))}; written in {run['write_s']:.1f} s")
    lines += [
        f"- Each query: median of {args.repeats} runs in a fresh process after a warm-up query on a 2-rank run; "
        "RSS growth = peak resident memory during the runs minus resident memory before them"
        + ("" if exact else " (ru_maxrss: includes imports)"),
        "",
        "| query | " + " | ".join(f"{args.ranks} x {s:,}: median (s) | RSS growth (MiB)" for s in sizes) + " |",
        "|---|" + "---:|---:|" * len(sizes),
    ]
    for name, (label, _) in MEASURES.items():
        cells = [f"{results[s][name]['median_s']:.3f} | {results[s][name]['rss_growth_mib']:.0f}" for s in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    view = results[big]["view"]
    if (args.ranks, big) == TARGET_RUN:
        verdict = f"target: under {VIEW_TARGET_S:.0f} s, {'met' if view['median_s'] < VIEW_TARGET_S else 'NOT met'}"
    else:
        verdict = f"the target, under {VIEW_TARGET_S:.0f} s, is set for {TARGET_RUN[0]} x {TARGET_RUN[1]:,}"
    lines += ["", f"The ranks view of {args.ranks} x {big:,} builds in {view['median_s']:.2f} s ({verdict}); it draws "
              f"{view['points']:,} points ({view['figure_kib']:.0f} KiB of figure JSON)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=100_000, help="iterations per rank (the larger run)")
    parser.add_argument("--part-rows", type=int, default=16_384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update the results file")
    parser.add_argument("--measure", choices=list(MEASURES), help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warm", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # one measurement, in the fresh process the parent started
        print(json.dumps(measure(args.measure, args.run, args.warm, args.repeats)))
        return 0
    sizes = sorted({max(args.iterations // 10, 1), args.iterations})
    with tempfile.TemporaryDirectory(prefix="memprof-bench-ranks-") as tmp:
        from tests.memprof.trace.ranks.many_ranks import write_many_ranks

        warm = write_many_ranks(Path(tmp) / "warm" / "run", 2, 600, part_rows=200, detailed=(0, 500))
        runs = {size: write_run(Path(tmp) / f"n{size}" / "run", args.ranks, size, args.part_rows) for size in sizes}
        results: dict[int, dict] = {}
        for size in sizes:
            results[size] = {}
            for name in MEASURES:
                print(f"{size:,} iterations: {name} ...", file=sys.stderr, flush=True)
                results[size][name] = _in_fresh_process(name, Path(tmp) / f"n{size}" / "run", warm, args.repeats)
    text = report(args, sizes, runs, results)
    print(text)
    if not args.no_write:
        RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
