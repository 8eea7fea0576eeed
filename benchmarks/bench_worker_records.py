"""The background worker's CPU per record, stage by stage, on saved journals of the benchmark models.

Run ``python -m benchmarks.bench_worker_records [--iterations 60] [--passes 3] [--rounds 3] [--against DIR]``.
First it profiles ``--iterations`` steps of each model of :mod:`benchmarks.bench_profiler` (1 intra-op thread,
the default detail policy) and keeps each run's journal, its worker replaced by one that answers at once and
processes nothing. Then, in a fresh process per pass, the worker's own code processes each journal from its first
record and writes its parts (``catch_up`` and ``flush``, its stages timed by :class:`memprof.trace.pipeline.worker.
Stages`); the best of the passes counts. ``--against DIR`` runs the same passes with the memprof of another
checkout (``DIR`` on ``PYTHONPATH``), alternating with this one round by round, for a before and after; each
checkout processes journals its own code saved (the journal's format may differ between them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Answers every record it is woken for at once and processes nothing, so that the journal stays whole.
_NULL_WORKER = """
import json, os
buffer, answered = b"", -1
while chunk := os.read(0, 65536):
    buffer += chunk
    *lines, buffer = buffer.split(b"\\n")
    for line in (line.decode().strip() for line in lines):
        if line == "end":
            os._exit(0)
        if line:
            through = int(line.split()[0])
            os.write(1, "".join(json.dumps({"done": i}) + "\\n" for i in range(answered + 1, through + 1)).encode())
            answered = max(answered, through)
"""

# One pass per model: the worker's code on a copy of the journal (run with the memprof first on sys.path).
_PASS = """
import json, shutil, sys, tempfile, time
from pathlib import Path
from memprof.trace.pipeline import worker
from memprof.trace.pipeline.journal import JOURNAL_DIR
worker._send = lambda *args: None
if hasattr(worker, "_send_all"):
    worker._send_all = lambda *args: None
found = {}
for journal in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(journal, run / JOURNAL_DIR)
        stages = worker.Stages()
        processing = worker._Worker(run, stages)
        stages.cpu_s.clear()
        stages.lap("start")
        start = time.process_time()
        processing.catch_up(None)
        processing.flush()
        found[Path(journal).name] = {"total": time.process_time() - start, "cpu_s": dict(stages.cpu_s),
                                     "records": stages.counts["records"]}
print(json.dumps(found))
"""


def save_journals(out: Path, iterations: int) -> list[Path]:
    """Profiles each benchmark model and keeps its journal under ``out/<model>``."""
    import torch

    from benchmarks.bench_profiler import MODELS, steady_malloc
    from examples import zoo
    from memprof import MemoryProfiler
    from memprof.capture import sinks
    from memprof.trace.pipeline.journal import JOURNAL_DIR

    def null_worker(sink: sinks.BackgroundSink) -> Any:
        proc = subprocess.Popen([sys.executable, "-c", _NULL_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        return sinks._Worker(proc, proc.stdin, proc.stdout)

    steady_malloc()
    torch.set_num_threads(1)
    sinks.BackgroundSink._start = null_worker  # type: ignore[method-assign]
    saved = []
    for spec in MODELS:
        torch.manual_seed(0)
        model, make_batch = spec.build()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        batch = make_batch(spec.batch_size)
        with tempfile.TemporaryDirectory() as tmp:
            profiler = MemoryProfiler(model, optimizer, out_dir=tmp, run_id="run", print_period=0)
            for _ in range(iterations):
                zoo.train_step(model, optimizer, batch)
                profiler.record_stats()
            shutil.copytree(Path(tmp) / "run" / JOURNAL_DIR, out / spec.name)
            with warnings.catch_warnings():  # (the stand-in worker leaves the records after its last wake-up)
                warnings.simplefilter("ignore", RuntimeWarning)
                profiler.close()
        saved.append(out / spec.name)
    return saved


_SAVE = """
import sys
from pathlib import Path
from benchmarks.bench_worker_records import save_journals
print("\\n".join(map(str, save_journals(Path(sys.argv[1]), int(sys.argv[2])))))
"""


def journals_of(code: Path, out: Path, iterations: int) -> list[Path]:
    """:func:`save_journals` run by ``code``'s own memprof and benchmark, in a fresh process."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-c", _SAVE, str(out), str(iterations)], capture_output=True, text=True,
                          env=env, cwd=code, check=True)
    return [Path(line) for line in done.stdout.split()]


def one_pass(code: Path, journals: list[Path]) -> dict[str, Any]:
    """The worker's stages on every journal, in a fresh process with ``code``'s memprof."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _PASS, *map(str, journals)], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir(), check=True)
    return json.loads(done.stdout)


def report(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per model and code: ms per record in all and per stage, of the best pass."""
    lines = ["| Model | Code | All stages (ms/record) | Analysis | Journal read and decode | Parts and state |",
             "|---|---|---:|---:|---:|---:|"]
    for key, passes in found.items():
        best = min(passes, key=lambda p: p["total"])
        per = {stage: 1e3 * seconds / best["records"] for stage, seconds in best["cpu_s"].items()}
        parts = sum(v for stage, v in per.items() if stage.startswith("flush"))
        model, code = key.split("|")
        lines.append(f"| {model} | {code} | {1e3 * best['total'] / best['records']:.2f} | {per.get('analysis', 0):.2f}"
                     f" | {per.get('journal read and decode', 0):.2f} | {parts:.2f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Saves the journals, times the passes, prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--passes", type=int, default=3, help="passes per round (the best counts)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout's root, to compare with this one")
    args = parser.parse_args(argv)
    codes = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    found: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="memprof-journals-") as tmp:
        journals = {label: journals_of(code, Path(tmp) / label, args.iterations) for label, code in codes.items()}
        for _ in range(args.rounds):
            for label, code in codes.items():
                for _ in range(args.passes):
                    for model, result in one_pass(code, journals[label]).items():
                        found.setdefault(f"{model}|{label}", []).append(result)
    print("\n".join(report(dict(sorted(found.items())))))


if __name__ == "__main__":
    main()
