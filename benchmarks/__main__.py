"""``python -m benchmarks``: runs every benchmark, one process each, and writes docs/benchmarks.md.

Each section is the benchmark's own printed output (a Markdown table). Options: ``--only NAME ...``
to run some sections, ``--quick`` for fewer repeats (a smoke run, not for publishing). With ``--only``,
the sections run replace their own text in the existing report (or are appended to it); every other
section, hand-written ones included, is kept as it was.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from memprof.atomic import write_atomically

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"

SECTIONS = {
    "profiler": ("1. Profiler overhead (vs no profiler, MemTracker, torch.profiler)", ["benchmarks.bench_profiler"],
                 ["--repeats", "2", "--steps", "5"]),
    "worker": ("1b. The background worker's cost to the training step", ["benchmarks.bench_worker"],
               ["--cycles", "3"]),
    "attribution": ("2. Attribution: categories at the peak vs allocator truth", ["benchmarks.bench_attribution"], []),
    "solver": ("3. Planner solve time (rotor DP, 500 slots)", ["benchmarks.bench_solver"], []),
    "binomial": ("3b. Binomial checkpointing on very long chains; rotor against it at equal memory",
                 ["benchmarks.bench_binomial"],
                 ["--lengths", "1000", "10000", "--rotor-lengths", "50", "100", "--repeats", "1"]),
    "quality": ("4-5. Predicted vs measured; memory saved vs time paid; rotor vs periodic",
                ["benchmarks.bench_quality"], ["--steps", "3"]),
    "real_models": ("6. The planner on models written by others (Hugging Face, torchvision-style)",
                    ["benchmarks.bench_real_models"], ["--repeats", "1"]),
    "graphs": ("6b. General graphs: a U-Net and an encoder-decoder transformer, planned, applied, measured",
               ["benchmarks.bench_real_models", "--models", "unet", "seq2seq", "--algorithms", "rotor", "selective"],
               ["--repeats", "1"]),
    "estimate": ("9. Estimates on fake tensors: predicted vs measured step peak, and their cost",
                 ["benchmarks.bench_estimate"], ["--repeats", "1", "--skip-large"]),
    "dashboard": ("Dashboard responsiveness", ["benchmarks.bench_dashboard"], []),
    "options_view": ("The Planner view with recomputation options", ["benchmarks.bench_options_view"], []),
    "long_dashboard": ("The dashboard on a 100,000-iteration run", ["benchmarks.bench_long_dashboard"],
                       ["--repeats", "3", "--part-iterations", "1000"]),
    "ranks": ("Many ranks: one streaming pass vs DuckDB vs loading every rank", ["benchmarks.bench_ranks"],
              ["--iterations", "10000", "--repeats", "2"]),
    "long_run": ("7a. Long runs: trace size, files, record_stats() cost, load time and memory over 100,000 steps",
                 ["benchmarks.bench_long_run", "--model", "small", "deep"], ["--iterations", "1000", "10000"]),
    "long_run_costs": ("7b. Long runs: record_stats() with detail for every iteration vs the default policy",
                       ["benchmarks.bench_long_run", "--costs", "--model", "small", "deep", "--repeats", "5"],
                       ["--steps", "100", "--repeats", "1"]),
    "compaction": ("7c. Trace compaction over a long run", ["benchmarks.bench_compaction"], ["--iterations", "10000"]),
    "offload": ("8. Offload vs rotor on an 8-layer Llama (predicted, default 24 GB/s link)",
                ["benchmarks.bench_offload"], ["--steps", "3", "--grid", "30", "--repeats", "2"]),
    "selective": ("10. Selective recomputation vs torch.compile's min-cut and rotor on GPT-2 small",
                  ["benchmarks.bench_selective"], ["--quick", "--repeats", "1", "--budgets", "3"]),
    "weights": ("8b. Weight streaming vs offload vs rotor on an 8-layer Llama, whole step (predicted, 24 GB/s)",
                ["benchmarks.bench_weights"], ["--steps", "3", "--grid", "20"]),
    "compile": ("12. memprof's schedules under torch.compile against activation_memory_budget",
                ["benchmarks.bench_compile"], ["--quick"]),
}


def run_section(module: list[str], quick_args: list[str], quick: bool) -> tuple[str, float]:
    """Runs one benchmark module in its own process; returns its output and wall time."""
    started = time.perf_counter()
    command = [sys.executable, "-m", *module, *(quick_args if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = done.stdout.strip() or done.stderr.strip()[-2000:]
    if done.returncode != 0:
        text += f"\n\n(exit code {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''})"
    return text, time.perf_counter() - started


def _is_boundary(line: str) -> bool:
    """Whether ``line`` starts a section: a known section's heading, or a numbered hand-written one (``## 1c.``).

    Benchmarks print headings of their own (``## Wall clock``), which stay inside their section.
    """
    if not line.startswith("## "):
        return False
    title = line[3:].strip()
    return title in {t for t, _, _ in SECTIONS.values()} or title[:1].isdigit()


def merge_sections(report: str, sections: dict[str, str]) -> str:
    """``report`` with each of ``sections`` (title -> its text) in place of the section of that title.

    A section absent from the report is appended. Everything else -- the header, the other sections,
    hand-written ones -- is kept verbatim.
    """
    lines = report.rstrip("\n").split("\n")
    out: list[str] = []
    done: set[str] = set()
    index = 0
    while index < len(lines):
        line = lines[index]
        title = line[3:].strip() if line.startswith("## ") else None
        if title in sections:
            out += sections[title].rstrip("\n").split("\n") + [""]
            done.add(title)
            index += 1
            while index < len(lines) and not _is_boundary(lines[index]):
                index += 1
            continue
        out.append(line)
        index += 1
    for title, text in sections.items():
        if title not in done:
            out += ["", *text.rstrip("\n").split("\n")]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Runs the selected sections and writes the report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    parts = [
        "# Benchmarks",
        "",
        f"- First written: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC (each section says when it ran)",
        f"- Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"torch {torch.__version__}, Python {platform.python_version()}, CUDA: "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}",
        f"- Load average at start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        "- Command: `python -m benchmarks [--only SECTION ...]` (sections not named are kept as they were)",
        "",
    ]
    # sections not run, hand-written ones and their notes are kept; each section says when it ran
    report = args.out.read_text(encoding="utf-8") if args.out.exists() else "\n".join(parts) + "\n"
    for name in args.only:
        title, module, quick_args = SECTIONS[name]
        print(f"running {name} ...", file=sys.stderr, flush=True)
        text, seconds = run_section(module, quick_args, args.quick)
        stamp = f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
        command = f"python -m {' '.join(module)}{' ' + ' '.join(quick_args) if args.quick else ''}"
        section = "\n".join([f"## {title}", "", f"_({seconds:.0f} s, {stamp}; `{command}`)_", "", text, ""])
        report = merge_sections(report, {title: section})
        write_atomically(args.out, report)  # after each section: a later one failing loses nothing
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
