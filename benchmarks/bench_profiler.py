"""Profiler overhead: the step time of a CPU training loop with each memory profiler, over none.

Run ``python -m benchmarks.bench_profiler [--repeats N] [--steps N] [--threads 1,0] [--pairing steps]``. For
each model, one model and optimizer per configuration (same seed, same batch) trains in rounds; each round runs
every tool in turn, in an order rotated from round to round. With ``--pairing steps`` (the default) a tool's
timed steps alternate one for one with the baseline's, which trains on a thread of its own that no profiler
watches (:mod:`benchmarks.step_thread`), so that noise from the machine (other processes, frequency changes,
slow spells lasting tens of seconds) falls on both sides of every ratio alike; the two trade model instances
every other round (:func:`swapped_instances`), step on threads started for the block (:func:`run_paired_block`),
the main thread only orchestrating, and ``baseline 2`` (a second bare lane) reads the measurement's own error; with
``--pairing blocks`` the
baseline runs a block of its own in the rotation. Each round runs every thread setting (``--threads``:
1 intra-op thread and torch's default, by default), so the two are measured side by side in one run. A
configuration's tool is started at the beginning of its block of steps and stopped at its end, because memprof
and ``torch.profiler`` share PyTorch's one profiler session and cannot be on at the same time. Warm-up steps
after each start are not counted. A step's time is the wall clock of ``train_step`` plus the tool's
per-iteration call (``record_stats()`` for memprof, ``prof.step()`` for ``torch.profiler``); starting and
stopping the tool (for ``torch.profiler``, stopping plus processing its events) are reported apart, as one-off
costs.

memprof's background worker is a child process. Its CPU is counted in the CPU columns: after the warm-up the
benchmark waits until the worker has processed the warm-up's records and written them (the warm-up's detailed
iterations have large parts, which with 10-step blocks would otherwise be written among the timed steps) and reads
its CPU time so far (``/proc/<pid>/task/*/schedstat``); what it spends from there to its exit (the timed steps' records, its last
writes) is divided over the timed steps, like the inline mode's work inside ``record_stats()``. Its start (the
interpreter, numpy and pyarrow: about 0.4 s of CPU, once per run) is reported apart, as a one-off, like
``torch.profiler``'s processing at the end; the worker's own account of where its CPU went, stage by stage, is
reported too (:class:`memprof.trace.pipeline.worker.Stages`).

glibc's malloc hands freed memory back to the kernel and faults it in again on the next step, more or
less often depending on where its heap happens to end: on this machine the cnn's baseline step took
31.6 to 38.7 ms from one block to the next (0 to 2,300 page faults per step) while nothing else
changed, which swamps the few percent being measured. ``--malloc steady`` (the default) pins
glibc's trim and mmap thresholds with ``mallopt`` at start, the same for every configuration, the
baseline included; it narrows the round-to-round spread (two back-to-back runs on 2026-11-23 gave
memprof's per-round ratios 1.03-1.10x with it, 1.04-1.15x without, and pooled ratios within 0.03x of
each other). ``--malloc default`` measures with glibc's own settings.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import gc
import math
import os
import platform
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from benchmarks.step_thread import StepThread
from examples import zoo
from memprof import MemoryProfiler
from memprof.capture import worker_judge
from memprof.capture.sinks import MAX_PENDING
from memprof.errors import CorruptTraceError
from memprof.trace.pipeline.journal import read_state
from memprof.trace.pipeline.worker import PRIORITY_ENV

RESULTS_PATH = Path(__file__).parent / "results" / "profiler_overhead.md"
# issue 35: memprof's default mode, at torch's default threads, at most 1.05x wall and 1.25x CPU (children
# included), and at or below torch.profiler on both
TARGET_WALL, TARGET_CPU = 1.05, 1.25
DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, read before anything sets it
ERROR_CHARS = 120  # a failing tool's cell shows this much of its error
#: Uncounted steps after each start: past the worker's start-up, the detailed first iterations and the judgement
#: of the worker (memprof.capture.worker_judge: 16 records settle, 32 are judged), so the timed steps are a long run's.
WARMUP_STEPS = 80


@dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: how to build it and the batch it trains on."""

    name: str
    build: Callable[[], zoo.ModelAndData]
    batch_size: int
    sizes: str


# Sized so that one step takes roughly 50-100 ms on one core of a small CPU: a realistic step, since
# a profiler's cost is per module call and per allocation and a 1 ms toy step would only show that.
MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("mlp", partial(zoo.mlp, blocks=24, width=512, in_features=512), 64,
              "24 blocks, width 512, batch 64"),
    ModelSpec("cnn", partial(zoo.cnn, channels=16, blocks=4, image=32), 24,
              "4 residual blocks, 16 channels, 32x32 images, batch 24"),
    ModelSpec("transformer", partial(zoo.transformer, dim=128, heads=4, layers=4, seq=64), 8,
              "4 layers, dim 128, 4 heads, seq 64, batch 8"),
)


# --------------------------------------------------------------------------- the tools
class Tool:
    """No profiler: the baseline. Subclasses attach a profiler between ``start`` and ``stop``."""

    name = "baseline"
    #: uncounted steps after each start where fewer than ``--warmup`` will do (``None``: ``--warmup``)
    warmup_steps: int | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        """Attaches the tool before a block of steps."""

    def after_step(self) -> None:
        """The tool's per-iteration call, made after every training step."""

    def after_warmup(self) -> None:
        """Called between the warm-up and the timed steps (not timed)."""

    def stop(self) -> None:
        """Detaches the tool (and, where it has one, processes what it recorded)."""

    def child_cpu_ms(self) -> float | None:
        """CPU ms of the tool's child process from the end of the warm-up to the stop (``None``: none measured)."""
        return None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While the baseline steps between this tool's (``--pairing steps``): holds what the tool runs beside
        training (memprof's worker), so it runs only in the tool's own steps, as it would in a run of its own."""
        yield

    def worker_stats(self) -> dict | None:
        """The last block's worker stats (:class:`memprof.trace.pipeline.worker.Stages`), where there is a worker."""
        return None

    def switched_at(self) -> int | None:
        """The first iteration of the last block whose record the training thread processed instead of memprof's
        worker (:class:`memprof.capture.worker_judge.Switch`); ``None``: no switch."""
        return None


class Memprof(Tool):
    """memprof's ``MemoryProfiler``, with ``record_stats()`` after every step."""

    name = "memprof"
    background = True
    steady = True  # the submodules' hooks off in repeated iterations (memprof.capture.steady)
    priority: str | None = None  # the worker's scheduling priority (memprof.trace.pipeline.worker.lower_priority)

    def __init__(self) -> None:
        self._profiler: MemoryProfiler | None = None
        self._runs = 0
        self._sink: object = None
        self._warm_cpu_s: float | None = None
        self._children_s = 0.0

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        self._runs += 1
        run_id = f"{type(self).__name__.lower()}-{self._runs}"
        # the worker reads it when it starts (with the first record); every lane sets its own
        if self.priority is None:
            os.environ.pop(PRIORITY_ENV, None)
        else:
            os.environ[PRIORITY_ENV] = self.priority
        self._profiler = MemoryProfiler(model, optimizer, out_dir=workdir, run_id=run_id, print_period=0,
                                        background=self.background, steady=self.steady)
        self._sink, self._warm_cpu_s = self._profiler._sink, None

    def after_step(self) -> None:
        self._profiler.record_stats()

    def after_warmup(self) -> None:
        sink, profiler = self._sink, self._profiler
        pid = getattr(sink, "pid", None)
        if pid is None or profiler is None:
            return
        if sink.mode != "background":  # its records went to the training thread: the worker has exited
            self._warm_cpu_s, self._children_s = 0.0, _children_cpu_s()
            return
        # let the worker finish the warm-up's records (it gathers a few before it wakes) and write them, then read
        # its CPU: the parts of the warm-up's detailed iterations are the warm-up's, not the timed steps' (with
        # 10-step blocks their flush would otherwise fall among the timed steps)
        while sink.mode == "background" and sink._answered < sink._submitted:
            profiler._handle(sink._read(block=True))
        _wait_for_flush(sink.journal_dir, profiler.iteration - 1)
        self._warm_cpu_s = worker_cpu_s(pid) if sink.mode == "background" else None
        self._children_s = _children_cpu_s()

    def stop(self) -> None:
        if self._profiler is not None:
            self._profiler.close()
            self._profiler = None

    def child_cpu_ms(self) -> float | None:
        if self._warm_cpu_s is None:
            return None
        # the worker has exited and been waited for: the children's total grew by all of its CPU
        return ((_children_cpu_s() - self._children_s) - self._warm_cpu_s) * 1e3

    def worker_stats(self) -> dict | None:
        return getattr(self._sink, "worker_stats", None)

    def switched_at(self) -> int | None:
        switch = getattr(self._sink, "switched", None)
        return None if switch is None else switch.iteration

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        sink = self._sink
        pid = getattr(sink, "pid", None) if getattr(sink, "mode", None) == "background" else None
        if pid is None:
            yield
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _wait_for_flush(journal_dir: Path, through: int, timeout_s: float = 5.0) -> None:
    """Waits until the worker has written iteration ``through`` (its saved state says so; it writes what it has
    once training pauses for half a second)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        with contextlib.suppress(OSError, CorruptTraceError):
            if read_state(journal_dir).last_iteration >= through:
                return
        time.sleep(0.05)


def worker_cpu_s(pid: int) -> float | None:
    """CPU seconds a running process has used so far, all its threads (``None`` where /proc cannot tell)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


class MemprofInline(Memprof):
    """memprof with ``background=False``: all analysis and writing inside ``record_stats()``."""

    name = "memprof (inline)"
    background = False


class MemprofWorkerOnly(Memprof):
    """memprof with its background worker kept however far training waits for it (the default hands the records
    to the training thread once training waited half the worker's CPU: ``memprof.capture.worker_judge.INLINE_WAIT_SHARE``)."""

    name = "memprof (worker only)"

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        self._share, worker_judge.INLINE_WAIT_SHARE = worker_judge.INLINE_WAIT_SHARE, math.inf
        super().start(model, optimizer, workdir)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            worker_judge.INLINE_WAIT_SHARE = self._share


class MemprofEveryHook(Memprof):
    """memprof with ``steady=False``: every hook in every iteration, as before steady iterations."""

    name = "memprof (every hook)"
    steady = False


class MemprofNice10(Memprof):
    """memprof with its worker at nice 10, its nominal priority before issue 35 (not in the default set: ``--tools``)."""

    name = "memprof (worker nice 10)"
    priority = "nice:10"


class MemprofNice0(Memprof):
    """memprof with its worker at training's own priority (not in the default set: ``--tools``)."""

    name = "memprof (worker nice 0)"
    priority = "nice:0"


class MemprofNice19(Memprof):
    """memprof with its worker at nice 19 (not in the default set: ``--tools``)."""

    name = "memprof (worker nice 19)"
    priority = "nice:19"


class MemTrackerTool(Tool):
    """PyTorch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``), entered around the block.

    Its per-iteration call is ``reset_mod_stats()``: without it MemTracker refuses a module's second
    forward ("does not support memory tracking for multiple iterative calls").
    """

    name = "MemTracker"

    def __init__(self) -> None:
        self._tracker = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        tracker.__enter__()
        self._tracker = tracker

    def after_step(self) -> None:
        self._tracker.reset_mod_stats()

    def stop(self) -> None:
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)


class TorchProfiler(Tool):
    """``torch.profiler.profile`` with every memory option on, ``prof.step()`` after every step."""

    name = "torch.profiler"
    #: it has no start-up to get past, and every warm-up step's events are processed at its stop (with 80, over a
    #: minute per block here)
    warmup_steps = 10

    def __init__(self) -> None:
        self._profiler: torch.profiler.profile | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                          record_shapes=True, with_stack=True)
        profiler.start()
        self._profiler = profiler

    def after_step(self) -> None:
        self._profiler.step()

    def stop(self) -> None:
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
            profiler.key_averages()  # events are parsed lazily: count that processing here


class SecondBaseline(Tool):
    """No profiler, on a model instance of its own: how far two bare lanes differ (memory layout, the machine's
    noise), the measurement's own error."""

    name = "baseline 2"


TOOLS: tuple[type[Tool], ...] = (Tool, Memprof, MemprofEveryHook, MemprofInline, MemTrackerTool, TorchProfiler)
#: Measured on request (``--tools``): the worker's scheduling priority, against the default's (SCHED_IDLE); the worker
#: kept however far training waits; a second baseline (the control).
EXTRA_TOOLS: tuple[type[Tool], ...] = (MemprofWorkerOnly, MemprofNice0, MemprofNice10, MemprofNice19, SecondBaseline)


# --------------------------------------------------------------------------- measuring
@dataclass
class Lane:
    """One configuration: a model, its optimizer and batch, a tool, and what was measured.

    ``wall_ms`` and ``cpu_ms`` hold one list per round: each timed step's wall-clock time and the CPU
    time the process spent on it (all threads), both covering ``train_step`` and the tool's
    per-iteration call. ``cpu_ms`` also carries, spread evenly over the block's steps, the CPU time of
    the tool's child processes (memprof's background worker), so work moved out of the training
    process is still counted.
    """

    spec: ModelSpec
    threads: int
    tool: Tool
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: zoo.Batch
    wall_ms: list[list[float]] = field(default_factory=list)
    cpu_ms: list[list[float]] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)  # wall clock of the per-iteration call alone
    start_ms: list[float] = field(default_factory=list)
    stop_ms: list[float] = field(default_factory=list)
    child_cpu_ms: list[float] = field(default_factory=list)  # per step, of the tool's child processes
    child_start_ms: list[float] = field(default_factory=list)  # CPU of the child's start, once per block
    stats: list[dict] = field(default_factory=list)  # the worker's own account, one per block
    switched_at: list[int | None] = field(default_factory=list)  # per block: where the records left the worker
    #: ``--pairing steps``: per round, the baseline's steps interleaved one for one with this lane's timed steps
    #: (wall, CPU), which its ratios are taken against instead of the baseline's own block
    paired_wall_ms: list[list[float]] = field(default_factory=list)
    paired_cpu_ms: list[list[float]] = field(default_factory=list)
    error: str | None = None


def make_lane(spec: ModelSpec, tool: Tool, threads: int = 1) -> Lane:
    """Builds the configuration's own model, optimizer and batch, identical for every tool."""
    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    return Lane(spec, threads, tool, model, optimizer, make_batch(spec.batch_size))


def _ms_since(start_s: float) -> float:
    return (time.perf_counter() - start_s) * 1e3


def _step(lane: Lane) -> tuple[float, float, float]:
    """One training step and the tool's call: wall ms, process CPU ms (all threads), and the call's wall ms."""
    cpu_start_s, start_s = time.process_time(), time.perf_counter()
    zoo.train_step(lane.model, lane.optimizer, lane.batch)
    call_s = time.perf_counter()
    lane.tool.after_step()
    return _ms_since(start_s), (time.process_time() - cpu_start_s) * 1e3, _ms_since(call_s)


Timed = tuple[list[float], list[float], tuple[list[float], list[float]] | None]


def _timed_steps(lane: Lane, warmup: int, steps: int) -> Timed:
    """``--pairing blocks``: the lane's steps alone."""
    wall_ms, cpu_ms = [], []
    for i in range(warmup + steps):
        if i == warmup:
            lane.tool.after_warmup()
        wall, cpu, call = _step(lane)
        if i >= warmup:
            wall_ms.append(wall)
            cpu_ms.append(cpu)
            lane.call_ms.append(call)
    return wall_ms, cpu_ms, None


@contextlib.contextmanager
def step_thread(name: str) -> Iterator[StepThread]:
    """A :class:`StepThread` started now, with the calling thread's torch intra-op setting (torch reads it per
    thread)."""
    threads = torch.get_num_threads()
    with StepThread(name) as helper:
        helper.call(partial(torch.set_num_threads, threads))
        yield helper


#: ``--pairing steps``: the baseline's uncounted steps before each block's interleaved ones.
PAIRED_BASE_WARMUP = 5


def paired_steps(lane: Lane, warmup: int, steps: int, *, base: Lane) -> Timed:
    """``--pairing steps``: the lane's timed steps interleaved one for one with the baseline's; who goes first
    alternates. The baseline's wall and CPU per step come back with the lane's.

    The baseline steps on a thread started after the tool's warm-up, which no profiler watches: memprof's reporter
    and torch.profiler's operator events sit in the profiler slot of the thread that started them, and
    torch.profiler's Python tracer (``with_stack``) sets itself on the threads that exist when it starts (a thread
    started before it had its Python calls traced too, 20 of them beside the tool's 5 in a check)."""
    for _ in range(warmup):
        _step(lane)
    lane.tool.after_warmup()
    with step_thread("baseline-steps") as other:

        def base_step() -> tuple[float, float, float]:
            with lane.tool.held():
                return other.call(partial(_step, base))

        for _ in range(PAIRED_BASE_WARMUP):
            base_step()
        wall_ms, cpu_ms, base_wall, base_cpu = [], [], [], []
        for i in range(steps):
            theirs = base_step() if i % 2 else None
            wall, cpu, call = _step(lane)
            theirs = theirs or base_step()
            wall_ms.append(wall)
            cpu_ms.append(cpu)
            lane.call_ms.append(call)
            base_wall.append(theirs[0])
            base_cpu.append(theirs[1])
            base.call_ms.append(theirs[2])
    return wall_ms, cpu_ms, (base_wall, base_cpu)


def run_block(lane: Lane, warmup: int, steps: int, workdir: Path,
              timed: Callable[[Lane, int, int], Timed] = _timed_steps) -> None:
    """One round of one configuration; a failure is kept as the lane's error, never raised. ``timed`` runs its
    steps (:func:`paired_steps` interleaves them with the baseline's)."""
    if lane.error is not None:
        return
    if lane.tool.warmup_steps is not None:
        warmup = min(warmup, lane.tool.warmup_steps)
    gc.collect()  # every block starts from the same garbage-collector state
    started = False
    children_s = _children_cpu_s()
    try:
        start_s = time.perf_counter()
        lane.tool.start(lane.model, lane.optimizer, workdir)
        started = True
        lane.start_ms.append(_ms_since(start_s))
        wall_ms, cpu_ms, paired = timed(lane, warmup, steps)
        stop_s = time.perf_counter()
        started = False
        lane.tool.stop()
        lane.stop_ms.append(_ms_since(stop_s))
        stats = lane.tool.worker_stats()
        start_ms = 1e3 * float(stats["cpu_s"].get("start", 0.0)) if stats else 0.0
        timed_child = lane.tool.child_cpu_ms()
        if timed_child is not None:  # the worker's CPU from the end of the warm-up on, over the timed steps
            child_ms = timed_child / steps
        else:  # no measure at the warm-up's end: all of it but its start, spread over every step
            child_ms = ((_children_cpu_s() - children_s) * 1e3 - start_ms) / (warmup + steps)
        lane.child_cpu_ms.append(child_ms)
        lane.child_start_ms.append(start_ms)
        if stats:
            lane.stats.append(stats)
            lane.switched_at.append(lane.tool.switched_at())
        lane.wall_ms.append(wall_ms)
        lane.cpu_ms.append([t + child_ms for t in cpu_ms])
        if paired is not None:
            lane.paired_wall_ms.append(paired[0])
            lane.paired_cpu_ms.append(paired[1])
    except Exception as exc:  # noqa: BLE001 - a tool that fails on a model is a result, not a crash
        lane.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:ERROR_CHARS]
        if started:
            _stop_quietly(lane.tool)


def _children_cpu_s() -> float:
    # Children's CPU time is added here once they have been waited for (memprof's close() does).
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stop_quietly(tool: Tool) -> None:
    # A tool left attached would distort (or break) every later configuration.
    with contextlib.suppress(Exception):
        tool.stop()


@contextlib.contextmanager
def swapped_instances(lane: Lane, base: Lane, swap: bool) -> Iterator[None]:
    """With ``swap``, ``lane`` and ``base`` trade model, optimizer and batch for the block: two instances of one
    model step at persistently different speeds (where their tensors happen to lie; 3% on the transformer here),
    which trading them every other round cancels out of the ratios."""
    if not swap:
        yield
        return
    fields = ("model", "optimizer", "batch")
    mine, theirs = (tuple(getattr(x, name) for name in fields) for x in (lane, base))
    for name, a, b in zip(fields, theirs, mine):
        setattr(lane, name, a)
        setattr(base, name, b)
    try:
        yield
    finally:
        for name, a, b in zip(fields, mine, theirs):
            setattr(lane, name, a)
            setattr(base, name, b)


def run_paired_block(lane: Lane, base: Lane, warmup: int, steps: int, workdir: Path) -> None:
    """:func:`run_block` with :func:`paired_steps`, on a thread started for the block, as the baseline's is
    (:func:`paired_steps`): the two sides step on threads of the same age, each with an OpenMP team of its own
    (with the tool on the main thread and the baseline always on one helper, two bare lanes read 1.05x apart on
    the transformer), and the main thread only orchestrates."""
    with step_thread("tool-steps") as mine:
        mine.call(partial(run_block, lane, warmup, steps, workdir, partial(paired_steps, base=base)))


#: How a tool's steps are compared with the baseline's: interleaved one for one in the same block (``steps``,
#: the default), or in blocks of their own run back to back (``blocks``).
PAIRINGS = ("steps", "blocks")


def run_all(specs: Sequence[ModelSpec], repeats: int, warmup: int, steps: int,
            tools: Sequence[type[Tool]] = TOOLS, threads: Sequence[int] = (1,),
            pairing: str = "steps") -> dict[tuple[str, int], list[Lane]]:
    """Runs every round; each round visits every thread setting and model, its tools in a rotated order.

    ``pairing="steps"``: each tool's block interleaves its timed steps with the baseline's (:func:`paired_steps`;
    the baseline keeps every block's steps too); ``"blocks"``: the baseline runs a block of its own in the
    rotation."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, found {pairing!r}")
    lanes = {(spec.name, n): [make_lane(spec, tool_type(), n) for tool_type in tools]
             for n in threads for spec in specs}
    with tempfile.TemporaryDirectory(prefix="memprof-bench-") as tmp:
        for r in range(repeats):
            for n in threads:
                torch.set_num_threads(n)
                for spec in specs:
                    row = lanes[spec.name, n]
                    workdir = Path(tmp) / f"{spec.name}-{n}"
                    if pairing == "blocks":
                        shift = r % len(row)
                        for lane in row[shift:] + row[:shift]:
                            run_block(lane, warmup, steps, workdir)
                        continue
                    base, tools_row = row[0], row[1:]
                    shift = r % max(len(tools_row), 1)
                    for lane in tools_row[shift:] + tools_row[:shift]:
                        blocks = len(lane.paired_wall_ms)
                        with swapped_instances(lane, base, swap=r % 2 == 1):
                            run_paired_block(lane, base, warmup, steps, workdir)
                        if len(lane.paired_wall_ms) > blocks:  # (the baseline's own figures: all its steps)
                            base.wall_ms.append(lane.paired_wall_ms[-1])
                            base.cpu_ms.append(lane.paired_cpu_ms[-1])
            print(f"round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    return lanes


# --------------------------------------------------------------------------- reporting
WALL, CPU = "wall_ms", "cpu_ms"  # the measures a ratio can be taken on: a step's wall clock, its CPU
#: The wall clock of whole blocks: every step counted, the rare long ones too (the training thread waiting for
#: memprof's worker once it fell :data:`memprof.capture.sinks.MAX_PENDING` records behind), which a median
#: step leaves out. Taken on ``wall_ms``; the ratio is the median over rounds of a round's mean-step ratio.
WALL_MEAN = "wall_mean"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _pooled(lane: Lane, measure: str) -> list[float]:
    return [t for block in getattr(lane, measure) for t in block]


def _theirs(lane: Lane, base: Lane, measure: str) -> list[list[float]]:
    """What ``lane``'s blocks compare with, per round: the baseline's steps interleaved with them where they were
    (``--pairing steps``), else the baseline's block of the same round."""
    wall = measure in (WALL, WALL_MEAN)
    paired = lane.paired_wall_ms if wall else lane.paired_cpu_ms
    return paired or getattr(base, WALL if wall else CPU)


def _ratio(lane: Lane, base: Lane, measure: str) -> float:
    if measure == WALL_MEAN:
        return _median(_round_ratios(lane, base, measure))
    return _median(_pooled(lane, measure)) / _median([t for block in _theirs(lane, base, measure) for t in block])


def _round_ratios(lane: Lane, base: Lane, measure: str) -> list[float]:
    pairs = zip(getattr(lane, WALL if measure == WALL_MEAN else measure), _theirs(lane, base, measure))
    if measure == WALL_MEAN:  # each round's steps ran side by side: their means compare like for like
        return [statistics.fmean(mine) / statistics.fmean(theirs) for mine, theirs in pairs]
    return [_median(mine) / _median(theirs) for mine, theirs in pairs]


def _baseline(base: Lane, measure: str) -> float:
    if measure == WALL_MEAN:
        return _median([statistics.fmean(block) for block in base.wall_ms])
    return _median(_pooled(base, measure))


def ratio_cell(lane: Lane, base: Lane, measure: str) -> str:
    """``1.04x (1.01-1.07)``: the ratio and the range of per-round ratios; or the error."""
    if lane.error is not None:
        return f"error: {lane.error}"
    ratios = _round_ratios(lane, base, measure)
    return f"{_ratio(lane, base, measure):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


Lanes = dict[tuple[str, int], list[Lane]]  # (model, intra-op threads) -> baseline first, then the tools


def threads_label(threads: int) -> str:
    """``1`` or ``2 (torch's default)``."""
    return f"{threads} (torch's default)" if threads == DEFAULT_THREADS else str(threads)


def summary_table(lanes: Lanes, measure: str) -> list[str]:
    """One row per model and thread setting, one ratio column per tool, on wall-clock or CPU time."""
    tools = [lane.tool.name for lane in next(iter(lanes.values()))[1:]]
    unit = "CPU ms/step" if measure == CPU else "ms/step" if measure == WALL else "mean ms/step"
    lines = [f"| Model | Sizes | Threads | Baseline ({unit}) | " + " | ".join(tools) + " |",
             "|---|---|---|---:|" + "---:|" * len(tools)]
    for (name, threads), row in sorted(lanes.items(), key=lambda kv: (_model_rank(kv[0][0]), kv[0][1])):
        base = row[0]
        cells = [ratio_cell(lane, base, measure) for lane in row[1:]]
        lines.append(f"| {name} | {base.spec.sizes} | {threads_label(threads)} | "
                     f"{_baseline(base, measure):.1f} | " + " | ".join(cells) + " |")
    return lines


def _model_rank(name: str) -> int:
    names = [m.name for m in MODELS]
    return names.index(name) if name in names else len(names)


def detail_table(lanes: Lanes) -> list[str]:
    """Per configuration: step times, the per-iteration call (median, and mean: with memprof's waits for its
    worker), and the one-off start/stop costs."""
    lines = ["| Model | Threads | Tool | Median step (ms) | Fastest step (ms) | Median step CPU (ms) | "
             "Per-iteration call (ms) | Call, mean (ms) | Child CPU (ms/step) | Start (ms) | Child start (CPU ms) | "
             "Stop + processing (ms) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, threads), row in sorted(lanes.items(), key=lambda kv: (_model_rank(kv[0][0]), kv[0][1])):
        for lane in row:
            if lane.error is not None:
                lines.append(f"| {name} | {threads} | {lane.tool.name} | error: {lane.error} | | | | | | | | |")
                continue
            wall = _pooled(lane, WALL)
            lines.append(f"| {name} | {threads} | {lane.tool.name} | {_median(wall):.1f} | {min(wall):.1f} | "
                         f"{_median(_pooled(lane, CPU)):.1f} | {_median(lane.call_ms):.2f} | "
                         f"{statistics.fmean(lane.call_ms) if lane.call_ms else float('nan'):.2f} | "
                         f"{_median(lane.child_cpu_ms):.2f} | {_median(lane.start_ms):.1f} | "
                         f"{_median(lane.child_start_ms):.0f} | {_median(lane.stop_ms):.1f} |")
    return lines


def merged_stats(stats: Sequence[dict]) -> tuple[dict[str, float], dict[str, int]]:
    """The worker stats of several blocks added up: CPU seconds per stage, and the counts."""
    cpu: dict[str, float] = {}
    counts: dict[str, int] = {}
    for block in stats:
        for stage, seconds in block.get("cpu_s", {}).items():
            cpu[stage] = cpu.get(stage, 0.0) + float(seconds)
        for what, n in block.get("counts", {}).items():
            counts[what] = counts.get(what, 0) + int(n)
    return cpu, counts


def worker_table(lanes: Lanes) -> list[str]:
    """Where memprof's worker spent its CPU, per stage: ms per record over every block's records."""
    # one column per lane with a worker: (model, threads, tool), the tool named when several lanes ran one
    found = [((name, threads, lane.tool.name), lane)
             for (name, threads), row in sorted(lanes.items(), key=lambda kv: (_model_rank(kv[0][0]), kv[0][1]))
             for lane in row if lane.stats]
    if not found:
        return ["(no worker ran)"]
    merged = {key: merged_stats(lane.stats) for key, lane in found}
    stages = sorted({stage for cpu, _ in merged.values() for stage in cpu if stage != "start"},
                    key=lambda st: -sum(cpu.get(st, 0.0) for cpu, _ in merged.values()))
    several = len({tool for (_, _, tool), _ in found}) > 1
    header = [f"{name}, {threads} thr." + (f", {tool}" if several else "") for (name, threads, tool), _ in found]
    lines = ["| Stage (CPU ms per record) | " + " | ".join(header) + " |", "|---|" + "---:|" * len(found)]
    for stage in stages:
        cells = []
        for key, _ in found:
            cpu, counts = merged[key]
            cells.append(f"{1e3 * cpu.get(stage, 0.0) / max(counts.get('records', 0), 1):.2f}")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    totals, starts, counts_row = [], [], []
    for key, _ in found:
        cpu, counts = merged[key]
        records = max(counts.get("records", 0), 1)
        totals.append(f"**{1e3 * sum(v for st, v in cpu.items() if st != 'start') / records:.2f}**")
        starts.append(f"{1e3 * cpu.get('start', 0.0) / max(len(dict(found)[key].stats), 1):.0f}")
        counts_row.append(f"{counts.get('records', 0)} ({counts.get('detailed', 0)}) / {counts.get('gathers', 0)}"
                          f" / {counts.get('flushes', 0)}")
    lines.append("| **all but the start** | " + " | ".join(totals) + " |")
    lines.append("| start, once per run (CPU ms) | " + " | ".join(starts) + " |")
    lines.append("| records (detailed) / gathers / flushes | " + " | ".join(counts_row) + " |")
    lines.append("| blocks whose records went to the training thread (from iteration) | "
                 + " | ".join(switch_cell(lane.switched_at) for _, lane in found) + " |")
    return lines


def switch_cell(switched_at: Sequence[int | None]) -> str:
    """``"3 of 8 (51-59)"``: the blocks where memprof's judge handed the records to the training thread, and the
    iterations it did so from."""
    at = sorted(i for i in switched_at if i is not None)
    where = "" if not at else f" ({at[0]})" if at[0] == at[-1] else f" ({at[0]}-{at[-1]})"
    return f"{len(at)} of {len(switched_at)}{where}"


def target_lines(lanes: Lanes) -> list[str]:
    """Whether memprof's default mode met issue 35's targets, at torch's default threads."""
    lines = []
    for (name, threads), row in sorted(lanes.items(), key=lambda kv: (_model_rank(kv[0][0]), kv[0][1])):
        if threads != DEFAULT_THREADS:
            continue
        lane = next((lane for lane in row if lane.tool.name == Memprof.name), None)
        if lane is None:
            continue
        torch_lane = next((lane for lane in row if lane.tool.name == TorchProfiler.name), None)
        verdicts = []
        for measure, target, label in ((WALL, TARGET_WALL, "wall (median step)"),
                                       (WALL_MEAN, TARGET_WALL, "wall (every step)"), (CPU, TARGET_CPU, "CPU")):
            ratio = float("inf") if lane.error else _ratio(lane, row[0], measure)
            ok = ratio <= target
            theirs = _ratio(torch_lane, row[0], measure) if torch_lane is not None and torch_lane.error is None \
                else None
            digits = 3 if theirs is not None and f"{ratio:.2f}" == f"{theirs:.2f}" else 2  # (a tie that is not one)
            text = f"{label} {ratio:.{digits}f}x (target {target:.2f}x: {'met' if ok else 'missed'}"
            if theirs is not None:
                text += f"; torch.profiler {theirs:.{digits}f}x: {'at or below' if ratio <= theirs else 'above'} it"
            verdicts.append(text + ")")
        lines.append(f"- {name}, {threads_label(threads)} threads: " + "; ".join(verdicts))
    return lines or ["- (memprof did not run at torch's default threads)"]


PAIRING_TEXT = {
    "steps": "Pairing: steps (`--pairing steps`). In every round each tool's block (its start, the uncounted warm-up, "
             "its timed steps, its stop) interleaves its timed steps one for one with the baseline's, who goes first "
             "alternating; the baseline trains its own model instance on a thread of its own, which neither "
             "profiler watches (both sit in the profiler slot of the thread that started them), and every other "
             "round the two trade model instances (two instances of one model step at persistently different "
             "speeds: the transformer's by 3% here); both step on threads started for the block, the baseline's "
             "after the tool's start, so that torch.profiler's Python tracer (`with_stack`), which sets itself on "
             "every thread alive when it starts, does not trace the baseline (the main thread only orchestrates). "
             "The two sides of a "
             "ratio so see the machine in the same state, 30-60 ms apart: on this shared machine a bare run's "
             "40-step means wander between 29 and 47 ms over tens of seconds, far more than the few percent being "
             "measured. A background worker still running in the timed steps (memprof's worker-only lane) is "
             "held (SIGSTOP) while the baseline steps and let go (SIGCONT) before the tool's next step, so it "
             "finds only the idle moments of its own lane's steps, as in a run of its own.",
    "blocks": "Pairing: blocks (`--pairing blocks`). In every round each configuration, the baseline included, runs "
              "a block of its own (start, uncounted warm-up, timed steps, stop), in an order rotated from round "
              "to round.",
}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other processes on the machine add noise."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_line() -> str:
    """Cores, CPU, torch and Python versions."""
    return (f"{os.cpu_count()} cores ({_cpu_name()}), torch {torch.__version__} ({DEFAULT_THREADS} intra-op "
            f"threads by default), Python {platform.python_version()}, {platform.system()} {platform.release()}")


def command_line() -> str:
    """The command that reproduces this run."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(Path.cwd())
    return " ".join([str(python), "-m", "benchmarks.bench_profiler", *sys.argv[1:]])


def _warmups(lanes: Lanes, warmup: int) -> str:
    """``80 warm-up steps`` and the tools that take fewer (``torch.profiler: 10``)."""
    fewer = sorted({(lane.tool.name, lane.tool.warmup_steps) for row in lanes.values() for lane in row
                    if lane.tool.warmup_steps is not None and lane.tool.warmup_steps < warmup})
    return f"{warmup} warm-up steps" + "".join(f", {name}: {steps}" for name, steps in fewer)


def render(lanes: Lanes, args: argparse.Namespace, elapsed_s: float) -> str:
    """The whole Markdown report."""
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# Profiler overhead on CPU", "",
        f"- Date: {now}", f"- Machine: {machine_line()}", f"- Command: `{command_line()}`",
        f"- Load average (1, 5, 15 min) at the start: {args.load_start}; at the end: {load_average()}",
        f"- malloc: {args.malloc_line}",
        f"- Rounds: {args.repeats} x {args.steps} timed steps per configuration ({_warmups(lanes, args.warmup)} "
        f"after each start not counted); Adam; wall time of the benchmark {elapsed_s:.0f} s", "",
        PAIRING_TEXT[args.pairing], "",
        "Each cell is the median step time with the tool divided by the median without it (pooled over "
        "all rounds); in brackets the smallest and largest ratio of a single round's medians.", "",
        "## Wall clock", "",
        *summary_table(lanes, WALL), "",
        "## Wall clock, every step counted", "",
        "A median step leaves out the rare long ones: memprof's training thread waits for its worker once the "
        f"worker, which runs only on a core that training leaves idle, falls {MAX_PENDING} records behind. Here each "
        "cell is "
        "the median over rounds of one round's mean step with the tool over the mean without it (range in "
        "brackets), the baseline column the median of its rounds' mean steps: what a run of many steps pays.", "",
        *summary_table(lanes, WALL_MEAN), "",
        "## CPU time", "",
        "The same ratios on the CPU time spent per step by the process (all its threads) and by memprof's "
        "background worker: its CPU from the end of the warm-up to its exit, over the timed steps (its start, "
        "once per run, is in the details below). Other processes on the machine slow the wall clock far more "
        "than they change this, so where the load average above is high these are the steadier numbers. "
        "memprof's wall-clock cost is below its CPU cost where its worker runs on a core that training leaves "
        "idle.", "",
        *summary_table(lanes, CPU), "",
        "## Targets (issue 35: memprof's default mode at torch's default threads)", "",
        *target_lines(lanes), "",
        "## The worker's CPU, stage by stage", "",
        "memprof's background worker's own account (`memprof.trace.pipeline.worker.Stages`, CPU time between "
        "laps), per record, over every record of every block: the warm-up's records, which keep their detail, "
        "included.", "",
        *worker_table(lanes), "",
        "## Details", "",
        *detail_table(lanes), "",
    ]
    return "\n".join(parts)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def steady_malloc() -> str:
    """Pins glibc's trim (1 GiB) and mmap (256 MiB) thresholds; says what was done, for the report."""
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_MMAP_THRESHOLD, 256 << 20) == 1
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to pin
        ok = False
    if not ok:
        return "not pinned (no glibc mallopt here)"
    return "glibc trim threshold 1 GiB, mmap threshold 256 MiB (`--malloc steady`)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8,
                        help="rounds (default 8: the cnn's single-round ratios spread over 0.1x on this machine)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration per round")
    parser.add_argument("--warmup", type=int, default=WARMUP_STEPS,
                        help=f"uncounted steps after each start (default {WARMUP_STEPS}: past memprof's worker "
                             "start-up, its detailed first iterations and its judgement of the worker)")
    parser.add_argument("--models", default=",".join(m.name for m in MODELS),
                        help="comma-separated subset of: " + ", ".join(m.name for m in MODELS))
    parser.add_argument("--threads", default="1,0",
                        help="comma-separated torch intra-op thread settings, measured side by side in every "
                             "round (default 1,0; 0: torch's own choice). One thread keeps the timings stable "
                             "when other processes share the cores: a 2-thread pool on 2 busy cores stalls at "
                             "its barriers and single steps take 10x longer")
    parser.add_argument("--malloc", choices=("steady", "default"), default="steady",
                        help="steady (default): pin glibc's trim and mmap thresholds so page-fault churn does "
                             "not drown the ratios; default: glibc's own settings")
    parser.add_argument("--tools", default=",".join(t.name for t in TOOLS),
                        help="comma-separated subset of: " + ", ".join(t.name for t in TOOLS + EXTRA_TOOLS)
                             + " (the baseline always runs)")
    parser.add_argument("--pairing", choices=PAIRINGS, default="steps",
                        help="steps (default): each tool's timed steps interleaved one for one with the baseline's "
                             "(on a thread of its own), so both see the machine in the same state; blocks: the "
                             "baseline's steps in a block of their own in the round's rotation")
    parser.add_argument("--batch-scale", type=float, default=1.0,
                        help="each model's batch times this (default 1; 0.5: steps about half as long, where "
                             "a profiler's cost per step, which the allocations and module calls fix, weighs more)")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH, help="where the Markdown report is written")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if min(args.repeats, args.steps) < 1 or args.warmup < 0 or args.batch_scale <= 0:
        parser.error("--repeats and --steps must be at least 1, --warmup at least 0, --batch-scale above 0")
    try:
        args.thread_settings = parse_threads(args.threads)
    except ValueError as exc:
        parser.error(f"--threads: {exc}")
    return args


def parse_threads(text: str) -> list[int]:
    """``"1,0"`` -> ``[1, torch's default]``, without repeats; raises ``ValueError`` on anything else."""
    settings: list[int] = []
    for item in text.split(","):
        n = int(item)
        if n < 0:
            raise ValueError(f"a thread count must be 0 (torch's default) or more, found {n}")
        n = n or DEFAULT_THREADS
        if n not in settings:
            settings.append(n)
    return settings


def scaled(spec: ModelSpec, scale: float) -> ModelSpec:
    """``spec`` with its batch times ``scale`` (at least 1), its description saying so."""
    batch = max(1, round(spec.batch_size * scale))
    return replace(spec, batch_size=batch, sizes=spec.sizes.replace(f"batch {spec.batch_size}", f"batch {batch}"))


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark, prints the report and writes it to ``--out``."""
    args = parse_args(argv)
    wanted = args.models.split(",")
    specs = [scaled(m, args.batch_scale) for m in MODELS if m.name in wanted]
    if not specs:
        raise SystemExit(f"no known model in --models {args.models!r}")
    wanted_tools = set(args.tools.split(","))
    tools = [t for t in TOOLS + EXTRA_TOOLS if t is Tool or t.name in wanted_tools]
    args.malloc_line = steady_malloc() if args.malloc == "steady" else "glibc's own thresholds"
    args.load_start = load_average()
    start_s = time.perf_counter()
    lanes = run_all(specs, args.repeats, args.warmup, args.steps, tools, args.thread_settings, args.pairing)
    report = render(lanes, args, time.perf_counter() - start_s)
    print(report)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
