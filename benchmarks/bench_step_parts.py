"""Where memprof's default mode spends CPU in the training process, part by part (issue 35).

Run ``python -m benchmarks.bench_step_parts [--model transformer] [--threads 1] [--steps 60] [--pairs 150]``.
Three measures on one model, CPU time throughout (``time.thread_time`` at 1 intra-op thread, where the training
thread does all the work; ``time.process_time`` otherwise), which other processes change far less than the wall
clock:

- **each hook** of :class:`memprof.capture.hooks.HookRecorder`, timed around every call during real steps (its
  code and data as cold as in training), less the timer's own cost;
- **the native reporter** (the allocator's events), and the hooks with it and a journal append, by pairs of steps
  on the same model, one with the part and one without in alternating order: the part's cost is the mean of the
  pairs' differences, given with its standard error (a single step's CPU varies by several ms on a shared machine);
- **``record_stats()``**, part by part: the reporter's events, the hooks' lists, the journal append (of which
  encoding the record), reading the worker's answers, waking it;
- **after a switch** (``--after-switch``: the judge hands the records to the training thread at its first window,
  :mod:`memprof.capture.worker_judge`), ``record_stats()`` and its parts as means per step (the analysis runs in
  gathers of 8 records, the Parquet parts every 64): the reporter's events, the journal append, the analysis, the
  parts, the phase clock, the steady-hooks check; the training thread's own CPU (``time.thread_time``) at any
  thread setting, since at 2 threads the process's CPU also counts torch's idle intra-op thread spinning meanwhile.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_profiler import MODELS, ModelSpec, steady_malloc
from examples import zoo
from memprof import MemoryProfiler
from memprof.analysis.iteration import IterationProcessor
from memprof.analysis.records import IterationRecord
from memprof.capture import hooks, inline_sinks, sinks, steady, worker_judge
from memprof.capture.native.stream import NativeAllocationStream
from memprof.trace.pipeline import journal

HOOKS = ("_forward_pre", "_forward_post", "_root_forward_pre", "_root_forward_post", "_node_ready", "_leaf_ready",
         "_grad_ready", "_optimizer_pre", "_optimizer_post", "_backward_done")
Clock = Callable[[], float]


@contextmanager
def timed(owner: Any, names: Sequence[str], spent: dict[str, float], calls: dict[str, int],
          clock: Clock) -> Iterator[None]:
    """Within the block, every call of ``owner.<name>`` adds its CPU seconds to ``spent[label]``."""
    saved = {name: getattr(owner, name) for name in names}

    def wrapper(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += clock() - start
                calls[name] += 1
        return call

    try:
        for name, function in saved.items():
            setattr(owner, name, wrapper(name, function))
        yield
    finally:
        for name, function in saved.items():
            setattr(owner, name, function)


def _timer_cost(clock: Clock) -> float:
    start = clock()
    for _ in range(20_000):
        clock()
    return (clock() - start) / 20_000


def _model(spec: ModelSpec) -> tuple[torch.nn.Module, torch.optim.Optimizer, zoo.Batch]:
    torch.manual_seed(0)
    model, make_batch = spec.build()
    return model, torch.optim.Adam(model.parameters(), lr=1e-4), make_batch(spec.batch_size)


def hook_costs(spec: ModelSpec, steps: int, clock: Clock) -> list[str]:
    """Table rows: each hook's CPU ms per step, its calls per step and µs per call."""
    model, optimizer, batch = _model(spec)
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    with timed(hooks.HookRecorder, HOOKS, spent, calls, clock):  # (before attach: the hooks bind these methods)
        recorder = hooks.HookRecorder(list(model.modules()), list(model.parameters()), optimizer)
        recorder.watch_inputs = True
        recorder.attach()
        for step in range(steps + 10):
            if step == 10:
                spent.clear()
                calls.clear()
            zoo.train_step(model, optimizer, batch)
            recorder.drain()
        recorder.detach()
    overhead = _timer_cost(clock) * 2
    rows, total = [], 0.0
    for name in sorted(spent, key=lambda n: -spent[n]):
        ms = (spent[name] - calls[name] * overhead) / steps * 1e3
        total += ms
        rows.append(f"| hook `{name}` | {ms:.3f} | {calls[name] / steps:.0f} calls, "
                    f"{ms * 1e3 / max(calls[name] / steps, 1):.1f} µs each |")
    return [f"| all hooks | {total:.3f} | |", *rows]


def _paired_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: zoo.Batch, part: str,
                 enabled: bool, journal_writer: journal.JournalWriter, clock: Clock) -> float:
    stream = recorder = None
    if enabled and part in ("reporter", "all"):
        stream = NativeAllocationStream(torch.device("cpu"))
        stream.start()
    if enabled and part in ("hooks", "all"):
        recorder = hooks.HookRecorder(list(model.modules()), list(model.parameters()), optimizer)
        recorder.attach()
    start = clock()
    zoo.train_step(model, optimizer, batch)
    events = stream.collect() if stream is not None else None
    drained = recorder.drain() if recorder is not None else None
    if part == "all" and enabled and events is not None and drained is not None:
        journal_writer.append(IterationRecord(iteration=0, epoch=0, start_ns=0, end_ns=0, events=events,
                                              **drained._asdict()))
    spent = clock() - start
    if stream is not None:
        stream.close()
    if recorder is not None:
        recorder.detach()
    return spent * 1e3


def paired_costs(spec: ModelSpec, pairs: int, clock: Clock) -> list[str]:
    """Table rows: the mean CPU a part adds to a step, by pairs of steps with and without it."""
    model, optimizer, batch = _model(spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="memprof-parts-") as tmp:
        writer = journal.JournalWriter(Path(tmp))
        for _ in range(5):
            zoo.train_step(model, optimizer, batch)
        for part, label in (("reporter", "the native reporter (allocation events)"), ("hooks", "the hooks"),
                            ("all", "reporter + hooks + journal append")):
            diffs = []
            for k in range(pairs):
                order = (True, False) if k % 2 else (False, True)
                found = {on: _paired_step(model, optimizer, batch, part, on, writer, clock) for on in order}
                diffs.append(found[True] - found[False])
            error = statistics.stdev(diffs) / math.sqrt(len(diffs))
            rows.append(f"| {label}, by pairs | {statistics.mean(diffs):.2f} | ± {error:.2f} (s.e.), median "
                        f"{statistics.median(diffs):.2f}, {pairs} pairs |")
        writer.close()
    return rows


def record_stats_costs(spec: ModelSpec, steps: int, clock: Clock) -> list[str]:
    """Table rows: ``record_stats()`` and its parts, medians over ``steps`` steps after a warm-up."""
    model, optimizer, batch = _model(spec)
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    found: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="memprof-parts-") as tmp, \
            timed(journal.JournalWriter, ["append"], spent, calls, clock), \
            timed(journal, ["encode_record_parts"], spent, calls, clock), \
            timed(sinks.BackgroundSink, ["_read", "_wake"], spent, calls, clock):
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp, print_period=0)
        with timed(profiler._stream, ["collect"], spent, calls, clock), \
                timed(profiler._recorder, ["drain"], spent, calls, clock):
            for step in range(steps + 20):
                zoo.train_step(model, optimizer, batch)
                spent.clear()
                start = clock()
                profiler.record_stats()
                if step >= 20:
                    found["record_stats()"].append(clock() - start)
                    for name in ("collect", "drain", "append", "encode_record_parts", "_read", "_wake"):
                        found[name].append(spent[name])
        profiler.close()
    labels = {"collect": "the reporter's events (`collect`)", "drain": "the hooks' lists (`drain`)",
              "append": "the journal append", "encode_record_parts": "of which encoding the record",
              "_read": "reading the worker's answers", "_wake": "waking the worker (mean: once per 8 records)"}
    rows = [f"| `record_stats()` | {statistics.median(found['record_stats()']) * 1e3:.3f} | median |"]
    for name, label in labels.items():
        value = statistics.mean(found[name]) if name == "_wake" else statistics.median(found[name])
        rows.append(f"| {label} | {value * 1e3:.3f} | |")
    return rows


@contextmanager
def _switch_at_once() -> Iterator[None]:
    saved = worker_judge.SETTLE_RECORDS, worker_judge.JUDGE_RECORDS, worker_judge.INLINE_WAIT_SHARE
    worker_judge.SETTLE_RECORDS, worker_judge.JUDGE_RECORDS, worker_judge.INLINE_WAIT_SHARE = 4, 4, 0.0
    try:
        yield
    finally:
        worker_judge.SETTLE_RECORDS, worker_judge.JUDGE_RECORDS, worker_judge.INLINE_WAIT_SHARE = saved


def switched_costs(spec: ModelSpec, steps: int, clock: Clock, warmup: int = 80) -> list[str]:
    """Table rows: ``record_stats()`` and its parts once the records are on the training thread, CPU ms per step
    as means over ``steps`` steps after ``warmup`` (the switch comes at the first window, within the warm-up)."""
    model, optimizer, batch = _model(spec)
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    total = 0.0
    with tempfile.TemporaryDirectory(prefix="memprof-parts-") as tmp, _switch_at_once(), \
            timed(journal.JournalWriter, ["append"], spent, calls, clock), \
            timed(IterationProcessor, ["process"], spent, calls, clock), \
            timed(inline_sinks.JournaledSink, ["_flush"], spent, calls, clock), \
            timed(steady.SteadyHooks, ["after"], spent, calls, clock), \
            timed(MemoryProfiler, ["_time_phases"], spent, calls, clock):
        profiler = MemoryProfiler(model, optimizer, out_dir=tmp, print_period=0)
        with timed(profiler._stream, ["collect"], spent, calls, clock):
            for step in range(warmup + steps):
                if step == warmup:
                    spent.clear()
                zoo.train_step(model, optimizer, batch)
                start = clock()
                profiler.record_stats()
                total += clock() - start if step >= warmup else 0.0
        parts = dict(spent)  # (before close(), which analyses and writes what is left)
        mode = profiler._sink.mode
        profiler.close()
    if mode != "inline":
        raise RuntimeError(f"the records stayed with the worker (mode {mode!r}): nothing after a switch to measure")
    labels = {"collect": "the reporter's events (`collect`)", "append": "the journal append",
              "process": "the analysis (gathers of 8)", "_flush": "the Parquet parts (every 64)",
              "_time_phases": "the phase clock", "after": "the steady-hooks check"}
    rows = [f"| `record_stats()` after a switch | {total / steps * 1e3:.3f} | mean |"]
    rows += [f"| {label} | {parts.get(name, 0.0) / steps * 1e3:.3f} | mean |" for name, label in labels.items()]
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=[m.name for m in MODELS])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--steps", type=int, default=60, help="steps timed for the hooks and record_stats()")
    parser.add_argument("--pairs", type=int, default=150, help="pairs of steps per part")
    parser.add_argument("--after-switch", action="store_true",
                        help="only record_stats() and its parts once the records are on the training thread")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Measures and prints the table."""
    args = parse_args(argv)
    steady_malloc()
    torch.set_num_threads(args.threads)
    clock: Clock = time.thread_time if args.threads == 1 else time.process_time
    spec = next(m for m in MODELS if m.name == args.model)
    print(f"- Model {args.model}, {args.threads} intra-op thread(s); CPU ms per step\n")
    print("| Part | CPU (ms/step) | |\n|---|---:|---|")
    if args.after_switch:
        # the training thread's own CPU: at 2 threads the process's also counts torch's idle intra-op thread
        # spinning while record_stats() runs, about as much again
        for row in switched_costs(spec, args.steps, time.thread_time):
            print(row)
        return
    for row in [*hook_costs(spec, args.steps, clock), *record_stats_costs(spec, args.steps, clock),
                *paired_costs(spec, args.pairs, clock)]:
        print(row)


if __name__ == "__main__":
    main()
