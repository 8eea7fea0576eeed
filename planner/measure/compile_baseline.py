"""The baseline selective recomputation is held to: torch.compile's min-cut partitioner, measured.

``torch._functorch.config.activation_memory_budget`` makes the partitioner of ``torch.compile`` keep at most
that fraction of the activations it would save, recomputing the rest in the backward graph. This module
compiles a model with that partitioner (``aot_autograd`` with inductor's decompositions and eager kernels,
i.e. the ``aot_eager_decomp_partition`` backend, plus FLOP counting inside the compiled graphs, where a
counter outside a compiled call does not see them) and measures, per budget, one training step the way
memprof measures its own schedules on CPU: the allocator's highest rise during the step over the state the
step starts with, the bytes the forward leaves for the backward, forward + backward FLOPs and step time.

:func:`write_compile_points` stores the points beside a run (``compile_points.json``) so the dashboard's Pareto view
shows them with the planner's predictions (``memprof profile-ops --compile-baseline``).
"""

from __future__ import annotations

import functools
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from memprof.atomic import write_atomically
from planner.errors import ChainError

COMPILE_BUDGETS: tuple[float, ...] = (1.0, 0.5, 0.3, 0.1)
COMPILE_POINTS_FILE = "compile_points.json"


@dataclass(frozen=True, kw_only=True)
class CompilePoint:
    """torch.compile at one ``activation_memory_budget``, measured.

    Attributes:
        activation_memory_budget: the partitioner's budget (1.0: its default).
        step_peak_bytes: the training step's peak: what it started with after ``zero_grad`` (weights,
            optimizer state) plus the CPU allocator's highest rise during it.
        held_bytes: what the forward left allocated for the backward (the loss included).
        flops: forward + backward FLOPs (recomputation included; 0: not counted, e.g. under inductor).
        step_ms: median wall time of a training step.
    """

    activation_memory_budget: float
    step_peak_bytes: int
    held_bytes: int
    flops: int
    step_ms: float


class CountingBackend:
    """``aot_eager_decomp_partition`` whose compiled forward and backward graphs count their FLOPs."""

    def __init__(self) -> None:
        self.counting = False
        self.flops = 0

    def _compiler(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if not self.counting:
                return gm(*args)
            with FlopCounterMode(display=False) as counter:
                out = gm(*args)
            self.flops += counter.get_total_flops()
            return out

        from torch._functorch.aot_autograd import make_boxed_func

        return make_boxed_func(run)

    def backend(self) -> Any:
        """The backend to pass to ``torch.compile``."""
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        def decompositions() -> Any:
            from torch._inductor.compile_fx import select_decomp_table

            return select_decomp_table()

        return aot_autograd(fw_compiler=self._compiler, bw_compiler=self._compiler, decompositions=decompositions,
                            partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"))

    def count(self, call: Callable[[], Any]) -> int:
        """FLOPs the compiled graphs run during ``call()``."""
        self.counting, self.flops = True, 0
        try:
            call()
        finally:
            self.counting = False
        return self.flops


def memory_events(call: Callable[[], Any]) -> tuple[Any, list[int]]:
    """``call()``'s result and the CPU allocator's events during it, in time order (sizes; frees negative).

    Python's cycle collector is run before and held off during the call: a collection inside it would free
    tensors of earlier work there, which would read as a fall in ``call``'s own memory.
    """
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = call()
    finally:
        if collecting:
            gc.enable()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    return result, [e.nbytes() for e in events]


def running_peak(deltas: Sequence[int], start: int = 0) -> tuple[int, int]:
    """The highest running total of ``deltas`` from ``start``, and the final total."""
    live = peak = start
    for delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak, live


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages of the parameters, their gradients, the optimizer's state and ``batch``."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None] + list(batch)
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measure_step(step_loss: Callable[[], torch.Tensor], model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 repeats: int, batch: Sequence[torch.Tensor] = ()) -> tuple[int, int, float]:
    """``(step peak bytes, held bytes, median step ms)`` of ``zero_grad; step_loss().backward(); step``.

    The peak is the state the step starts with after ``zero_grad`` (weights, optimizer state, and ``batch``'s
    tensors when given) plus the allocator's highest rise during the forward, backward and optimizer step.
    ``zero_grad`` runs before the window: torch.profiler reports no free of a block allocated before it started
    ("Memory block of unknown size"), so gradients freed inside it would be counted as still held.
    """
    def update() -> None:
        step_loss().backward()
        if optimizer is not None:
            optimizer.step()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        update()

    step()
    model.zero_grad(set_to_none=True)
    start = state_bytes(model, optimizer, batch)
    peak, _ = running_peak(memory_events(update)[1])
    model.zero_grad(set_to_none=True)
    loss, held = memory_events(step_loss)
    loss.backward()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1e3)
    return start + peak, sum(held), statistics.median(times)


def measure_compile(model: nn.Module, loss_of: Callable[[Callable[..., Any]], torch.Tensor],
                    optimizer: torch.optim.Optimizer | None = None, budgets: Sequence[float] = COMPILE_BUDGETS,
                    repeats: int = 3) -> list[CompilePoint]:
    """Measures torch.compile's partitioner on ``model`` at each budget.

    Args:
        model: the model (compiled here, left uncompiled).
        loss_of: ``loss_of(callable_model)`` runs the forward through the given callable and returns the loss.
        optimizer: the step's optimizer, or ``None`` for forward and backward only.
        budgets: the ``activation_memory_budget`` values.
        repeats: timed steps per budget (after two untimed ones).
    """
    import torch._dynamo
    import torch._functorch.config as functorch_config

    points = []
    for budget in budgets:
        torch._dynamo.reset()
        counter = CountingBackend()
        compiled = torch.compile(model, backend=counter.backend())
        with functorch_config.patch(activation_memory_budget=float(budget)):
            loss = functools.partial(loss_of, compiled)
            peak, held, ms = measure_step(loss, model, optimizer, repeats)
            flops = counter.count(lambda: loss().backward())  # noqa: B023 -- called at once
            model.zero_grad(set_to_none=True)
        points.append(CompilePoint(activation_memory_budget=float(budget), step_peak_bytes=peak, held_bytes=held,
                                   flops=flops, step_ms=ms))
    torch._dynamo.reset()
    return points


def write_compile_points(run_dir: str | Path, points: Sequence[CompilePoint]) -> Path:
    """Writes ``compile_points.json`` into ``run_dir`` (atomically) and returns its path."""
    path = Path(run_dir) / COMPILE_POINTS_FILE
    write_atomically(path, json.dumps({"points": [asdict(p) for p in points]}, indent=2) + "\n")
    return path


def read_compile_points(run_dir: str | Path) -> list[CompilePoint]:
    """The points stored beside a run; ``[]`` when it has none.

    Raises:
        ChainError: the file exists but is not a list of points.
    """
    path = Path(run_dir) / COMPILE_POINTS_FILE
    if not path.is_file():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))["points"]
        return [CompilePoint(**{k: item[k] for k in CompilePoint.__dataclass_fields__}) for item in raw]
    except (ValueError, KeyError, TypeError) as exc:
        raise ChainError(f"{path} is not a list of torch.compile points ({exc}); delete it or rewrite it with "
                         "memprof profile-ops --compile-baseline") from None
