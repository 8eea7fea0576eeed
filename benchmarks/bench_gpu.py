"""The CUDA paths on one GPU, side by side in one run: profiler, estimate, planner, offload, snapshots.

Run ``python -m benchmarks.bench_gpu [--out results.jsonl]`` on a machine with CUDA (``make gpu-check`` runs it
and writes ``docs/gpu.md``). The model is GPT-2 small from ``transformers.GPT2Config`` with random weights (12
layers, 768 wide, 12 heads, 50,257-token vocabulary, eager attention, fp32; nothing is downloaded), batch 8 x 512
tokens, AdamW. The checks, in this order (each one's targets are :data:`benchmarks.gpu_targets.CATALOGUE`):

1. ``estimate``: ``memprof.estimate(device="cuda")`` against the caching allocator's allocated peak of a
   steady-state step (less what the step did not allocate and the estimate does not model: cuBLAS's workspace)
   and its reserved peak over the first two steps, in a fresh allocator (it runs first).
2. ``profiler``: training steps with no profiler, with memprof, and with
   ``torch.cuda.memory._record_memory_history(max_entries=100_000)`` (PyTorch's documented use), in interleaved
   rounds; each step's time includes a ``torch.cuda.synchronize()`` and the tool's per-step call; memprof's
   timed steps are its steady ones, after the first iterations that keep their detail with every hook on. Each step's
   ``max_memory_allocated`` / ``max_memory_reserved`` (peaks reset at its start) against the iteration rows
   memprof wrote.
3. ``link``: pinned copy bandwidths each way (``planner.measure_transfer_bandwidth``): the offload schedules'
   link.
4. ``planner``: a profiled run (14 steps, ops recorded in one; the last ones steady, whose phase times scale the
   layers' times: ``planner.discovery.time_scale``) gives the chain ``transformer.h``; every algorithm of
   ``planner.solvers.dispatch.ALGORITHMS`` is solved halfway between rotor's minimum and store-all's peak (store-all at its
   own peak, an algorithm infeasible there at its own minimum; offload, and offload with weight streaming, at
   their minimum, where they must move something; one with no schedule at any budget is ``skipped``); each is
   applied and measured (``planner.measure.runs.measure_schedule``, 3 steps, the first excluded): its whole-step peak
   against the prediction; then (``measure_schedule`` too), still applied and with no profiler, the wall time of
   forward + backward synchronised with the device (median of 3 steps) against the predicted makespan; the note
   says how the chain scaled the layers' recorded times.
5. ``snapshot``: three steps of a small-batch GPT-2 under ``MemoryProfiler(snapshot_on_oom=True)``, then a
   1 PiB allocation: the snapshot it writes is imported and opened through the dashboard's data layer
   (``dashboard.data.TraceStore``), its step peaks against the profiler's own.

Each check is isolated: an exception ends that check alone (reported as ``error``), and each result is appended
to ``--out`` as soon as it is known, so a benchmark killed at its time limit keeps what it finished.
``--device cpu --size tiny`` runs what needs no CUDA on a tiny model (the others are ``skipped``): a smoke run
of this file on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_targets import (
    ERROR,
    ESTIMATE_ALLOCATED_REL,
    ESTIMATE_RESERVED_REL,
    INFO,
    OVERHEAD_LIMIT,
    OVERLAP_TIME_REL,
    PLAN_PEAK_ABS,
    PLAN_PEAK_REL,
    SKIPPED,
    SNAPSHOT_PEAK_REL,
    CheckResult,
    judged,
    percent,
    results_table,
    within,
)
from memprof.units import format_bytes

STREAM = "offload+stream"
"""The planner check's name for offload with weight streaming (``solve(..., "offload", stream_weights=True)``)."""


@dataclass(frozen=True)
class Size:
    """A GPT-2 configuration and its batch."""

    name: str
    layers: int
    width: int
    heads: int
    vocab: int
    positions: int
    seq: int
    batch: int

    def describe(self) -> str:
        """The size in words, for the report."""
        return (f"GPT-2 {self.layers} layers, width {self.width}, {self.heads} heads, vocabulary {self.vocab}, "
                f"batch {self.batch} x {self.seq} tokens, fp32, AdamW")


SIZES = {
    # GPT-2 small (124M parameters); about 0.1 s a step on an H100 in fp32, about 10 GiB at the peak
    "gpt2-small": Size("gpt2-small", 12, 768, 12, 50257, 1024, 512, 8),
    # a smoke run on a CPU: seconds
    "tiny": Size("tiny", 2, 64, 4, 512, 64, 32, 4),
}
#: Steps of the run the chain is built from: the detail policy's first 10 keep their hooks, the steady ones after
#: them time the step without them.
CHAIN_STEPS = 14
SNAPSHOT_BATCH, SNAPSHOT_SEQ = 2, 128  # the snapshot records every allocation's stack: a small step keeps it small


@dataclass
class Context:
    """What the checks share: the device, the model's size, a scratch folder, the link once measured."""

    device: torch.device
    size: Size
    scratch: Path
    rounds: int = 3
    steps: int = 8
    warmup: int = 3
    algorithms: tuple[str, ...] | None = None  # the planner check's; None: every one and STREAM
    link: Any = None  # planner.model.transfer.TransferCosts, set by the link check

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# --------------------------------------------------------------------------- the model and its step
def build_model(size: Size, device: torch.device | str, seed: int = 0) -> nn.Module:
    """GPT2LMHeadModel from a config with random weights, built directly on ``device`` (``"meta"`` included)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=size.vocab, n_positions=size.positions, n_embd=size.width, n_layer=size.layers,
                        n_head=size.heads, use_cache=False, attn_implementation="eager",
                        bos_token_id=size.vocab - 1, eos_token_id=size.vocab - 1)
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what it falls back to anyway, without the warning the fallback logs
    model.train()
    return model


def batch_maker(size: Size, device: torch.device, seq: int | None = None) -> Callable[[int], tuple[torch.Tensor]]:
    """``make_batch(n)``: ``n`` random sequences of token ids on ``device`` (labels are the inputs)."""
    length = seq or size.seq

    def make_batch(n: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, size.vocab, (n, length), device=device),)

    return make_batch


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The causal language-model loss of ``batch`` (the model shifts the labels)."""
    return model(input_ids=batch[0], labels=batch[0]).loss


def adamw(device: torch.device) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer]:
    """An AdamW factory; foreach on CUDA, as PyTorch picks for CUDA parameters and the estimate models."""
    return lambda params: torch.optim.AdamW(params, lr=1e-4, foreach=device.type == "cuda")


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> None:
    """Zero the gradients (to None), loss, backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    lm_loss(model, batch).backward()
    optimizer.step()


def sync(device: torch.device) -> None:
    """Waits for the device's queued work, so that host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Frees what the last check left, so the next starts from an empty cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _skipped(check: str, what: str, target: str) -> CheckResult:
    return CheckResult(check, what, target=target, status=SKIPPED, note="needs CUDA")


def _ratio(value: float) -> str:
    return f"{value:.3f}x"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


# --------------------------------------------------------------------------- 1. the estimate
def check_estimate(ctx: Context) -> Iterator[CheckResult]:
    """The CUDA estimate against the caching allocator's allocated and reserved peaks (a fresh allocator)."""
    allocated_what = "estimate's step peak vs max_memory_allocated of a real step"
    reserved_what = "estimate's reserved peak vs max_memory_reserved over two real steps"
    if not ctx.cuda:
        yield _skipped("estimate.allocated", allocated_what, "within 1%")
        yield _skipped("estimate.reserved", reserved_what, "within 5%")
        return
    from memprof import estimate
    from memprof.estimation.cuda_allocator import round_size

    size, device = ctx.size, ctx.device
    meta_model = build_model(size, "meta")
    ids = torch.empty(size.batch, size.seq, dtype=torch.long, device="meta")
    started = time.perf_counter()
    found = estimate(meta_model, (ids,), lm_loss, adamw(device), device="cuda", out_dir=ctx.scratch / "estimate")
    estimate_s = time.perf_counter() - started
    del meta_model

    release(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)  # a fresh process: 0
    model = build_model(size, device)
    optimizer = adamw(device)(list(model.parameters()))
    batch = batch_maker(size, device)(size.batch)
    train_step(model, optimizer, batch)
    sync(device)
    reserved_first = torch.cuda.max_memory_reserved(device)
    # What is allocated between steps that is neither model, gradients (kept until the next step's zero_grad),
    # optimizer state nor batch is not the step's (cuBLAS's workspace): the estimate runs no kernel and does
    # not model it (docs/estimate.md).
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    grads = (p.grad for p in model.parameters() if p.grad is not None)  # (not kept: zero_grad must free them)
    known = {t.untyped_storage().data_ptr(): round_size(t.untyped_storage().nbytes())
             for t in [*model.parameters(), *grads, *model.buffers(), *state, *batch]}
    unknown = torch.cuda.memory_allocated(device) - before - sum(known.values())
    torch.cuda.reset_peak_memory_stats(device)
    train_step(model, optimizer, batch)
    sync(device)
    raw_peak = torch.cuda.max_memory_allocated(device) - before
    measured = raw_peak - unknown
    reserved = max(reserved_first, torch.cuda.max_memory_reserved(device))
    error = (found.peak_bytes - measured) / measured
    yield CheckResult("estimate.allocated", allocated_what, format_bytes(found.peak_bytes), format_bytes(measured),
                      percent(error), "within 1%",
                      judged(within(found.peak_bytes, measured, rel=ESTIMATE_ALLOCATED_REL)),
                      f"{size.describe()}; the allocator's raw peak {format_bytes(raw_peak)} less "
                      f"{format_bytes(unknown)} allocated outside the step (cuBLAS workspace); "
                      f"estimate took {estimate_s:.1f} s")
    if found.reserved_peak_bytes is None:
        raise RuntimeError("the CUDA estimate gave no reserved_peak_bytes")
    yield CheckResult("estimate.reserved", reserved_what, format_bytes(found.reserved_peak_bytes),
                      format_bytes(reserved), percent((found.reserved_peak_bytes - reserved) / reserved), "within 5%",
                      judged(within(found.reserved_peak_bytes, reserved, rel=ESTIMATE_RESERVED_REL)),
                      "reserved from an empty cache: weights built on the device, then two steps")


# --------------------------------------------------------------------------- 2. the profiler
class Plain:
    """No profiler: the baseline. Subclasses attach a tool between ``start`` and ``stop``."""

    name = "no profiler"

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        """Attaches the tool before a block of steps."""

    def after_step(self) -> None:
        """The tool's per-step call."""

    def stop(self) -> Path | None:
        """Detaches the tool; returns the run it wrote, if any."""
        return None

    def warmup_steps(self, ctx: Context) -> int:
        """Steps after the start that are not timed."""
        return ctx.warmup


class WithMemprof(Plain):
    """memprof's ``MemoryProfiler`` as a user runs it (background worker), ``record_stats()`` each step."""

    name = "memprof"

    def __init__(self) -> None:
        self._profiler: Any = None
        self._runs = 0

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        from memprof import MemoryProfiler

        self._runs += 1
        self._profiler = MemoryProfiler(model, optimizer, out_dir=workdir, run_id=f"memprof-{self._runs}",
                                        print_period=0)

    def after_step(self) -> None:
        self._profiler.record_stats()

    def warmup_steps(self, ctx: Context) -> int:
        # A run's first iterations keep their detail, every hook on (the steady ones that follow are what a long
        # run pays): they are the warm-up here, their cost not the steady step's.
        from memprof.analysis.detail import DetailPolicy

        return max(ctx.warmup, DetailPolicy().first)

    def stop(self) -> Path | None:
        profiler, self._profiler = self._profiler, None
        profiler.close()
        return Path(profiler.run_dir)


class WithHistory(Plain):
    """PyTorch's allocation history, as its documentation shows it: ``max_entries=100_000``, stacks on."""

    name = "_record_memory_history"

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: Path) -> None:
        torch.cuda.memory._record_memory_history(max_entries=100_000)

    def stop(self) -> Path | None:
        torch.cuda.memory._record_memory_history(enabled=None)
        return None


@dataclass
class Block:
    """One tool's block of steps: the timed steps' seconds and, on CUDA, every step's allocator peaks."""

    tool: str
    seconds: list[float]
    peaks: list[tuple[int, int]]  # (max_memory_allocated, max_memory_reserved) per step, warm-up included
    run_dir: Path | None


def run_block(tool: Plain, model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...],
              ctx: Context) -> Block:
    """The tool's warm-up steps, then ``ctx.steps`` timed ones, with ``tool`` attached."""
    device = ctx.device
    seconds, peaks = [], []
    warmup = tool.warmup_steps(ctx)
    tool.start(model, optimizer, ctx.scratch / "overhead")
    try:
        for index in range(warmup + ctx.steps):
            started = time.perf_counter()
            if ctx.cuda:
                torch.cuda.reset_peak_memory_stats(device)
            train_step(model, optimizer, batch)
            sync(device)
            if ctx.cuda:
                peaks.append((torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)))
            tool.after_step()
            if index >= warmup:
                seconds.append(time.perf_counter() - started)
    finally:
        run_dir = tool.stop()
    return Block(tool.name, seconds, peaks, run_dir)


def peak_differences(blocks: list[Block]) -> tuple[list[int], list[int], int, int]:
    """Every memprof step's ``peak_allocated_bytes - max_memory_allocated`` and reserved likewise; the highest
    allocated and reserved peaks seen.

    Raises:
        RuntimeError: a run holds another number of iterations than its block ran steps.
    """
    from memprof import load_trace

    allocated, reserved, top_allocated, top_reserved = [], [], 0, 0
    for block in blocks:
        assert block.run_dir is not None
        rows = load_trace(block.run_dir).iterations.sort_values("iteration")
        if len(rows) != len(block.peaks):
            raise RuntimeError(f"{block.run_dir} holds {len(rows)} iterations for {len(block.peaks)} steps")
        for (peak, peak_reserved), row in zip(block.peaks, rows.itertuples()):
            allocated.append(int(row.peak_allocated_bytes) - peak)
            reserved.append(int(row.peak_reserved_bytes) - peak_reserved)
            top_allocated, top_reserved = max(top_allocated, peak), max(top_reserved, peak_reserved)
    return allocated, reserved, top_allocated, top_reserved


def _differences_text(differences: list[int]) -> str:
    worst = max(differences, key=abs)
    differing = sum(1 for d in differences if d)
    return f"{worst:+d} B at worst; {differing} of {len(differences)} steps differ"


def check_profiler(ctx: Context) -> Iterator[CheckResult]:
    """Step-time ratios against no profiler and PyTorch's history; memprof's peaks against the allocator's."""
    device = ctx.device
    model = build_model(ctx.size, device)
    optimizer = adamw(device)(list(model.parameters()))
    batch = batch_maker(ctx.size, device)(ctx.size.batch)
    for _ in range(ctx.warmup):  # cuBLAS's handles, the allocator's cache, the optimizer's state: before any block
        train_step(model, optimizer, batch)
    sync(device)
    tools: list[Plain] = [Plain(), WithMemprof(), *([WithHistory()] if ctx.cuda else [])]
    blocks: list[Block] = []
    for round_ in range(ctx.rounds):  # the order rotates, so a slow spell falls on every tool alike
        shift = round_ % len(tools)
        blocks += [run_block(tool, model, optimizer, batch, ctx) for tool in tools[shift:] + tools[:shift]]

    def median(name: str) -> float:
        return statistics.median(s for b in blocks if b.tool == name for s in b.seconds)

    def round_ratios(name: str, base: str) -> str:
        per_round = [statistics.median(a.seconds) / statistics.median(b.seconds)
                     for a, b in zip([b for b in blocks if b.tool == name], [b for b in blocks if b.tool == base])]
        return f"{min(per_round):.3f}-{max(per_round):.3f}x"

    counted = (f"median of {ctx.rounds} interleaved rounds x {ctx.steps} steps, memprof's after its first "
               f"{WithMemprof().warmup_steps(ctx)} (detail kept, every hook on); {ctx.size.describe()}")
    ratio = median("memprof") / median("no profiler")
    yield CheckResult("profiler.overhead_vs_none", "step time with memprof / without", _ms(median("memprof")),
                      f"{_ms(median('no profiler'))} (no profiler)", _ratio(ratio), f"at most {OVERHEAD_LIMIT:.2f}x",
                      judged(ratio <= OVERHEAD_LIMIT),
                      f"{counted}; per round {round_ratios('memprof', 'no profiler')}")
    history_what = "step time with memprof / with _record_memory_history"
    if not ctx.cuda:
        yield _skipped("profiler.overhead_vs_history", history_what, "reported")
        yield _skipped("profiler.peak_allocated", "memprof's peak_allocated_bytes vs max_memory_allocated", "equal")
        yield _skipped("profiler.peak_reserved", "memprof's peak_reserved_bytes vs max_memory_reserved", "equal")
        return
    history = median(WithHistory.name)
    yield CheckResult("profiler.overhead_vs_history", history_what, _ms(median("memprof")),
                      f"{_ms(history)} (_record_memory_history)", _ratio(median("memprof") / history), "reported",
                      INFO, f"{counted}; _record_memory_history over no profiler "
                      f"{history / median('no profiler'):.3f}x")
    allocated, reserved, top_allocated, top_reserved = peak_differences([b for b in blocks if b.run_dir])
    yield CheckResult("profiler.peak_allocated", "memprof's peak_allocated_bytes vs max_memory_allocated, each step",
                      f"{format_bytes(top_allocated)} (highest step)", "torch.cuda.max_memory_allocated",
                      _differences_text(allocated), "equal, every step", judged(not any(allocated)),
                      "peaks reset at each step's start; warm-up steps included")
    yield CheckResult("profiler.peak_reserved", "memprof's peak_reserved_bytes vs max_memory_reserved, each step",
                      f"{format_bytes(top_reserved)} (highest step)", "torch.cuda.max_memory_reserved",
                      _differences_text(reserved), "equal, every step", judged(not any(reserved)),
                      "peaks reset at each step's start; warm-up steps included")


# --------------------------------------------------------------------------- 3. the link
def check_link(ctx: Context) -> Iterator[CheckResult]:
    """Pinned copy bandwidths each way; kept in ``ctx.link`` for the offload schedules."""
    if not ctx.cuda:
        yield _skipped("transfer.d2h", "pinned device-to-host copy bandwidth", "reported")
        yield _skipped("transfer.h2d", "pinned host-to-device copy bandwidth", "reported")
        return
    from planner import measure_transfer_bandwidth

    ctx.link = measure_transfer_bandwidth(ctx.device)
    for check, direction, rate in (("transfer.d2h", "device-to-host", ctx.link.d2h_bytes_per_ms),
                                   ("transfer.h2d", "host-to-device", ctx.link.h2d_bytes_per_ms)):
        yield CheckResult(check, f"pinned {direction} copy bandwidth", f"{rate / 1e6:.1f} GB/s",
                          "24.0 GB/s (the planner's default link)", "", "reported", INFO,
                          "median of 5 copies of 64 MiB")


# --------------------------------------------------------------------------- 4. the planner
def plan(chain: Any, algorithm: str, budget: int) -> Any:
    """``algorithm``'s schedule at ``budget``; at its own minimum where ``budget`` is below it. Offload, and
    offload with weight streaming (``STREAM``), always at their minimum, where they must move something.

    Raises:
        planner.errors.InfeasibleBudgetError: the algorithm has no schedule for this chain at any budget.
    """
    from planner.errors import InfeasibleBudgetError
    from planner.solvers.dispatch import min_feasible_budget, solve

    if algorithm == STREAM:
        return solve(chain, min_feasible_budget(chain, "offload", stream_weights=True), "offload",
                     stream_weights=True)
    if algorithm == "offload":
        return solve(chain, min_feasible_budget(chain, "offload"), "offload")
    try:
        return solve(chain, budget, algorithm)
    except InfeasibleBudgetError:
        return solve(chain, min_feasible_budget(chain, algorithm), algorithm)


def schedule_note(schedule: Any) -> str:
    """What a reader needs to know of the schedule measured: its budget, what it offloads or streams."""
    parts = [f"budget {format_bytes(schedule.budget_bytes)}" if schedule.budget_bytes is not None else "no budget"]
    if schedule.params.fallback_from:
        parts.append(f"ran as {schedule.algorithm} (fallback from {schedule.params.fallback_from})")
    offloaded = schedule.params.offloaded or []
    if offloaded:
        parts.append(f"offloads stages {list(offloaded)}")
    elif schedule.algorithm == "offload":
        parts.append("offloads nothing (the transfers would not pay at this budget)")
    if schedule.streamed_weights:
        parts.append(f"streams the weights of stages {list(schedule.streamed_weights)}")
    return "; ".join(parts)


def time_scale_note(schedule: Any) -> str:
    """How the schedule's chain scaled the layers' recorded times (``planner.discovery.time_scale``)."""
    from planner.discovery.time_scale import TimeScale

    chain = getattr(schedule, "chain", None)
    return TimeScale.from_json(chain.source.get("time_scale") if chain is not None else None).describe()


def plan_results(algorithm: str, schedule: Any, comparison: Any) -> list[CheckResult]:
    """The peak row and the time row of one measured schedule (``comparison`` from ``measure_schedule``: its
    step time timed without the profiler)."""
    predicted, measured = comparison.predicted_peak_bytes, comparison.measured_peak_bytes
    note = schedule_note(schedule)
    peak = CheckResult(f"plan.{algorithm}.peak", f"{algorithm}: measured whole-step peak vs predicted",
                       format_bytes(measured), format_bytes(predicted), percent(comparison.peak_error),
                       "within 5% + 1 MiB", judged(within(measured, predicted, rel=PLAN_PEAK_REL,
                                                          abs_bytes=PLAN_PEAK_ABS)), note)
    overlap = algorithm in ("offload", STREAM)
    ms, makespan = comparison.measured_step_ms, comparison.predicted_makespan_ms
    time_row = CheckResult(f"plan.{algorithm}.time", f"{algorithm}: measured step time vs predicted makespan",
                           f"{ms:.1f} ms", f"{makespan:.1f} ms", percent((ms - makespan) / makespan),
                           "within 10%" if overlap else "reported",
                           judged(within(ms, makespan, rel=OVERLAP_TIME_REL)) if overlap else INFO,
                           "forward + backward, synchronised wall clock, median of 3 steps without the profiler; "
                           f"{time_scale_note(schedule)}")
    return [peak, time_row]


def check_planner(ctx: Context) -> Iterator[CheckResult]:
    """Every algorithm's schedule applied to GPT-2 and measured against its prediction."""
    from memprof import MemoryProfiler, load_trace
    from planner import chain_from_trace
    from planner.errors import InfeasibleBudgetError
    from planner.executor import remove_schedule
    from planner.measure.runs import measure_schedule
    from planner.solvers.dispatch import ALGORITHMS, min_feasible_budget, store_all_budget

    device, size = ctx.device, ctx.size
    model = build_model(size, device)
    optimizer = adamw(device)(list(model.parameters()))
    make_batch = batch_maker(size, device)
    out = ctx.scratch / "planner"
    with MemoryProfiler(model, optimizer, out_dir=out, run_id="profiled", print_period=0, background=False,
                        ops=True) as profiler:
        # the chain is costed from iterations 2-9 (0 warms up, 1 records the ops), their times scaled to those of
        # the steady iterations after them (planner.discovery.time_scale)
        for _ in range(CHAIN_STEPS):
            train_step(model, optimizer, make_batch(size.batch))
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    # named, as users of a Hugging Face model do: at a small batch the logits outweigh the blocks' activations
    # and the search would pick a shorter chain
    chain = chain_from_trace(trace, container="transformer.h")
    if ctx.link is not None:
        chain = chain.with_transfer(ctx.link)
    high, low = store_all_budget(chain), min_feasible_budget(chain, "rotor")
    middle = low + (high - low) // 2
    for algorithm in ctx.algorithms or (*ALGORITHMS, STREAM):
        what = f"{algorithm}: measured whole-step peak vs predicted"
        try:
            schedule = plan(chain, algorithm, high if algorithm == "store_all" else middle)
        except InfeasibleBudgetError as exc:  # e.g. revolve on a chain it cannot schedule: a fact, not a fault
            yield CheckResult(f"plan.{algorithm}.peak", what, target="within 5% + 1 MiB", status=SKIPPED,
                              note=f"no schedule: {one_line(exc)}")
            continue
        except Exception as exc:  # noqa: BLE001 -- a solver's failure is its row; the others still run
            traceback.print_exc()
            yield CheckResult(f"plan.{algorithm}.peak", what, target="within 5% + 1 MiB", status=ERROR,
                              note=f"solving: {one_line(exc)}")
            continue
        try:
            _, comparison = measure_schedule(model, make_batch, schedule, out, steps=3, batch_size=size.batch,
                                             run_id=f"measured-{algorithm}", source_run=trace.run_id, loss=lm_loss,
                                             optimizer=optimizer)
        except Exception as exc:  # noqa: BLE001 -- one algorithm's failure is its row; the others still run
            traceback.print_exc()
            yield CheckResult(f"plan.{algorithm}.peak", what, target="within 5% + 1 MiB", status=ERROR,
                              note=f"{schedule_note(schedule)}; {one_line(exc)}")
            continue
        finally:
            remove_schedule(model)
            release(device)
        yield from plan_results(algorithm, schedule, comparison)


# --------------------------------------------------------------------------- 5. the snapshot
def snapshot_view(traces: Path, imported: str, measured: str) -> dict[str, Any]:
    """Opens an imported snapshot run beside the profiler's own run through the dashboard's data layer.

    Returns:
        ``iterations`` (the imported run's), ``events`` (its timeline's rows in its highest step), ``failure``
        (the kind its meta records), ``compared`` (the iterations both runs hold, the first left out), and the
        highest step peak of each over them, ``imported_peak`` and ``measured_peak``.

    Raises:
        RuntimeError: the data layer cannot read a run (its error), or the runs share no iteration.
    """
    from dashboard.data import TraceStore

    store = TraceStore(traces)
    entries = {entry.name: entry for entry in store.runs()}
    for name in (imported, measured):
        if name not in entries:
            raise RuntimeError(f"the dashboard lists no run {name!r} in {traces} (it lists {sorted(entries)})")
        row = store.summary(entries[name])
        if row["error"]:
            raise RuntimeError(f"the dashboard cannot read {name}: {row['error']}")
    ours, theirs = store.iterations(imported), store.iterations(measured)
    # the step that ran out of memory is cut short differently by each: only whole steps are compared
    failed = {(store.meta(name).get("failure") or {}).get("iteration") for name in (imported, measured)}
    compared = sorted(set(ours.iteration.astype(int)) & set(theirs.iteration.astype(int)) - {0} - failed)
    if not compared:
        raise RuntimeError(f"the imported run's iterations {ours.iteration.tolist()} and the profiler's "
                           f"{theirs.iteration.tolist()} share none after the first")
    imported_peaks = ours.set_index("iteration").peak_allocated_bytes.loc[compared]
    highest = int(imported_peaks.idxmax())
    return {"iterations": len(ours), "events": len(store.timeline(imported, highest)),
            "failure": (store.meta(imported).get("failure") or {}).get("kind"), "compared": compared,
            "imported_peak": int(imported_peaks.max()),
            "measured_peak": int(theirs.set_index("iteration").peak_allocated_bytes.loc[compared].max())}


def check_snapshot(ctx: Context) -> Iterator[CheckResult]:
    """A real CUDA out-of-memory under ``snapshot_on_oom``: the snapshot imported and opened in the dashboard."""
    what = "snapshot_on_oom's snapshot imported and opened in the dashboard; its step peak vs the profiler's"
    if not ctx.cuda:
        yield _skipped("snapshot.dashboard", what, "opens; within 1%")
        return
    from memprof import MemoryProfiler
    from memprof.capture.oom_snapshot import SNAPSHOT_FILE
    from memprof.interop import import_snapshot

    device, size = ctx.device, ctx.size
    model = build_model(size, device)
    optimizer = adamw(device)(list(model.parameters()))
    make_batch = batch_maker(size, device, SNAPSHOT_SEQ)
    traces = ctx.scratch / "snapshot"
    profiler = None
    try:
        with MemoryProfiler(model, optimizer, out_dir=traces, run_id="measured", print_period=0,
                            snapshot_on_oom=True) as profiler:
            for _ in range(3):
                train_step(model, optimizer, make_batch(SNAPSHOT_BATCH))
                profiler.record_stats()
            torch.empty(2**50, dtype=torch.uint8, device=device)  # 1 PiB: always refused
    except torch.OutOfMemoryError:
        pass
    else:
        raise RuntimeError("a 1 PiB allocation did not fail: no out-of-memory to snapshot")
    assert profiler is not None
    path = Path(profiler.run_dir) / SNAPSHOT_FILE
    if not path.is_file():
        raise RuntimeError(f"snapshot_on_oom wrote no {SNAPSHOT_FILE} in {profiler.run_dir}")
    started = time.perf_counter()
    import_snapshot(path, traces / "imported")
    seconds = time.perf_counter() - started
    view = snapshot_view(traces, "imported", "measured")
    opened = view["events"] > 0 and view["failure"] == "oom"
    ok = opened and within(view["imported_peak"], view["measured_peak"], rel=SNAPSHOT_PEAK_REL)
    yield CheckResult("snapshot.dashboard", what, format_bytes(view["imported_peak"]),
                      f"{format_bytes(view['measured_peak'])} (profiler)",
                      percent((view["imported_peak"] - view["measured_peak"]) / view["measured_peak"]),
                      "opens; within 1%", judged(ok),
                      f"snapshot {format_bytes(path.stat().st_size)}, imported in {seconds:.1f} s: "
                      f"{view['iterations']} iterations, failure {view['failure']!r}, {view['events']} timeline "
                      f"events in its highest step; iterations compared {view['compared']}; batch "
                      f"{SNAPSHOT_BATCH} x {SNAPSHOT_SEQ}")


# --------------------------------------------------------------------------- running them
CHECKS: dict[str, Callable[[Context], Iterator[CheckResult]]] = {
    "estimate": check_estimate,  # first: its reserved peak needs an allocator nothing has used yet
    "profiler": check_profiler,
    "link": check_link,  # before the planner, whose offload schedules use the link it measures
    "planner": check_planner,
    "snapshot": check_snapshot,  # last: it runs out of memory on purpose
}


def one_line(exc: BaseException) -> str:
    """The exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_check(name: str, ctx: Context, sink: Callable[[CheckResult], None]) -> None:
    """Runs one check, giving each result to ``sink`` as it comes; an exception becomes an ``error`` row."""
    started = time.perf_counter()
    try:
        for result in CHECKS[name](ctx):
            sink(result)
    except Exception as exc:  # noqa: BLE001 -- isolated: the next check still runs
        traceback.print_exc()
        sink(CheckResult(name, f"the {name} check", status=ERROR, note=one_line(exc)))
    finally:
        release(ctx.device)
        print(f"bench_gpu: {name} took {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Runs the checks and prints their table; with ``--out``, appends each result to it as it comes."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run: CUDA checks skipped)")
    parser.add_argument("--size", choices=list(SIZES), default="gpt2-small")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the overhead check")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per tool and round")
    parser.add_argument("--algorithms", nargs="+", help=f"the planner check's algorithms (default: all, and {STREAM})")
    parser.add_argument("--out", type=Path, help="append each result to this file, one JSON object a line")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"no CUDA device here (torch {torch.__version__}); pass --device cpu for a smoke run")
    warnings.filterwarnings("ignore", module="transformers")
    results: list[CheckResult] = []

    def sink(result: CheckResult) -> None:
        results.append(result)
        print(f"bench_gpu: {result.check}: {result.status} {result.error} {result.note}".rstrip(), file=sys.stderr,
              flush=True)
        if args.out is not None:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(result.to_json() + "\n")

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        ctx = Context(device, SIZES[args.size], Path(scratch), rounds=args.rounds, steps=args.steps,
                      algorithms=tuple(args.algorithms) if args.algorithms else None)
        for name in args.only:
            run_check(name, ctx, sink)
    print(results_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
