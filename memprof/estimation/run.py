"""``estimate()``: a training step's memory, predicted on fake tensors before the step ever runs.

The model's parameters and buffers are swapped for fake twins (:mod:`memprof.estimation.fake`), a
:class:`~memprof.capture.profiler.MemoryProfiler` is attached with a
:class:`~memprof.estimation.stream.FakeAllocationStream` in place of the allocator, and two ordinary training
steps run under ``FakeTensorMode``: no memory is allocated and no kernel runs, only shapes are computed.
The profiler's own hooks and analysis make the trace, so an estimate has the categories, per-layer costs and
timeline of a measured run, and the planner and the dashboard read it unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memprof.capture.hooks import use_clock
from memprof.capture.profiler import MemoryProfiler
from memprof.capture.tensor_walk import fake_addresses
from memprof.categories import CATEGORIES, Category
from memprof.errors import EstimateError
from memprof.estimation.clock import ROOFLINES, VirtualClock
from memprof.estimation.fake import FakeConverter, fake_state
from memprof.estimation.stream import FakeAllocationStream
from memprof.estimation.workspace import WorkspaceProbe

__all__ = ["STEPS", "Estimate", "estimate"]

#: Steps an estimate runs: the first creates the optimizer's state, the second is the steady state reported.
STEPS = 2

LossFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Estimate:
    """The predicted memory of one training step (the second: optimizer state exists).

    Attributes:
        peak_bytes: the step's peak allocated bytes (model state, optimizer state, batch, activations).
        categories_at_peak_bytes: the bytes of each category at that peak (they sum to ``peak_bytes``).
        reserved_peak_bytes: the caching allocator's reserved bytes at their highest during the step, when
            CUDA is modelled; ``None`` on CPU, which caches nothing.
        peak_phase: the phase the peak falls in (``forward``, ``backward``, ``optimizer`` or ``other``).
        peak_module: the module running at the peak (``""``: none, or the root).
        device: the device modelled (``cpu`` or ``cuda``).
        run_dir: the trace of the estimate (``meta.json`` has ``"estimate": true``).
        seconds: how long the estimate took.
    """

    peak_bytes: int
    categories_at_peak_bytes: dict[Category, int]
    reserved_peak_bytes: int | None
    peak_phase: str
    peak_module: str
    device: str
    run_dir: Path
    seconds: float


def _modelled_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is None:
        first = next(iter(list(model.parameters()) + list(model.buffers())), None)
        kind = first.device.type if first is not None else "cpu"
        return torch.device("cuda" if kind == "cuda" else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise EstimateError(f"device must be 'cpu' or 'cuda', found {device!r}") from None
    if chosen.type not in ("cpu", "cuda"):
        raise EstimateError(f"device must be 'cpu' or 'cuda', found {device!r}")
    return torch.device(chosen.type)


def _ops_device(modelled: torch.device) -> torch.device:
    """Where the fake tensors live. CUDA's own operators (and their saved tensors) are used only where a GPU
    is present: on a build without CUDA, autograd cannot run fake CUDA tensors, so the step's operators are
    the CPU's and only the allocator is CUDA's."""
    if modelled.type == "cuda" and torch.cuda.is_available():
        return modelled
    return torch.device("cpu")


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Keeps FakeTensorMode from logging a traceback for an operator that raises: the error itself
    reaches the caller (the command line prints it as one line)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    saved = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(saved)


def _check(model: Any, loss_fn: Any, optimizer: Any) -> None:
    if not isinstance(model, nn.Module):
        raise EstimateError(f"expected a torch.nn.Module to estimate, found {type(model).__name__}")
    if not callable(loss_fn):
        raise EstimateError(f"loss_fn must be callable as loss_fn(model, batch), found {type(loss_fn).__name__}")
    if optimizer is not None and (isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer)):
        raise EstimateError(
            "optimizer must be a factory called with the parameters, e.g. lambda params: "
            f"torch.optim.AdamW(params), found {type(optimizer).__name__} (an optimizer built on the real "
            "parameters cannot step their fake twins)")


def _step(profiler: MemoryProfiler, model: nn.Module, converter: FakeConverter, batch: Any, loss_fn: LossFn,
          optimizer: torch.optim.Optimizer | None) -> None:
    fake_batch = converter.structure(batch)  # allocated inside the step, as a loader's batch would be
    profiler.mark_inputs(fake_batch)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    loss = loss_fn(model, fake_batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        found = type(loss).__name__ if not isinstance(loss, torch.Tensor) else f"a tensor of shape {list(loss.shape)}"
        raise EstimateError(f"loss_fn(model, batch) must return a scalar loss tensor that requires grad, "
                            f"found {found}")
    loss.backward()
    if optimizer is not None:
        optimizer.step()


def estimate(model: nn.Module, batch: Any, loss_fn: LossFn, optimizer: OptimizerFactory | None = None, *,
             device: str | torch.device | None = None, out_dir: str | Path = "traces",
             run_id: str | None = None) -> Estimate:
    """Predicts the memory of a training step without running it: no real memory, no data.

    Runs two training steps (zero the gradients, ``loss_fn(model, batch)``, backward, optimizer step) on fake
    tensors under a :class:`~memprof.MemoryProfiler`, and reports the second, when the optimizer's state
    exists (the steady state). The model's parameters and buffers are replaced by fake twins for the duration
    and given back afterwards; they may be real tensors or on the meta device.

    Args:
        model: the model (real, or built under ``torch.device("meta")``).
        batch: what ``loss_fn`` takes: tensors (real, fake or meta; only their shapes and dtypes are read),
            ``torch.Size`` leaves (a float tensor of that shape), in tuples, lists or dicts.
        loss_fn: ``loss_fn(model, batch)`` returns the scalar loss.
        optimizer: a factory of the optimizer, called with the list of (fake) parameters, e.g.
            ``lambda params: torch.optim.AdamW(params)``; ``None``: forward and backward only.
        device: the device modelled, ``"cpu"`` or ``"cuda"`` (default: the model's; ``cpu`` for meta).
            On CUDA, block sizes and reserved memory follow the caching allocator
            (:mod:`memprof.estimation.cuda_allocator`).
        out_dir: folder for the trace; it is written to ``out_dir/run_id``.
        run_id: name of the run (default ``<model class>-<UTC time>-<random>``).

    Raises:
        EstimateError: an operator needs tensor values (a data-dependent shape, ``.item()``); the message
            names it. Also bad arguments, or a loss that is not a scalar requiring grad.
    """
    _check(model, loss_fn, optimizer)
    started = time.perf_counter()
    modelled = _modelled_device(model, device)
    ops_device = _ops_device(modelled)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    # a kernel's own workspace, measured on the device whose operators run (CPU kernels say nothing of CUDA's)
    probe = WorkspaceProbe(device=ops_device) if ops_device.type == modelled.type else None
    clock = VirtualClock(ROOFLINES[modelled.type])
    stream = FakeAllocationStream(modelled, probe, clock)
    meta = {"estimate": True, "truth": "estimate", "fake_mode": "torch._subclasses.fake_tensor.FakeTensorMode",
            "modelled_device": str(modelled), "ops_device": str(ops_device), "estimate_steps": STEPS,
            "estimate_iteration": STEPS - 1, "clock": "virtual-roofline",
            "roofline": dataclasses.asdict(clock.roofline)}
    existed = run_id is not None and (Path(out_dir) / run_id).exists()  # then not ours to remove on failure
    with (use_clock(clock), fake_addresses(), _quiet_fake_tensor_log(),
          fake_state(model, FakeConverter(mode, ops_device)) as state, mode):
        built = optimizer(list(p for p in state if isinstance(p, nn.Parameter))) if optimizer is not None else None
        stream.adopt(state)
        profiler = MemoryProfiler(model, built, out_dir=out_dir, run_id=run_id, print_period=0, background=False,
                                  extra_meta=meta, detail_first=STEPS, allocation_stream=stream)
        try:
            for _ in range(STEPS):
                _step(profiler, model, FakeConverter(mode, ops_device), batch, loss_fn, built)
                profiler.record_stats()
            failure = stream.failure  # raised inside the step, and caught there by the user's code
            if failure is not None:
                raise failure
        except BaseException:
            profiler.close()
            if not existed:  # no trace of a step that could not be estimated
                shutil.rmtree(profiler.run_dir, ignore_errors=True)
            raise
        profiler.close()
    return _read(profiler.run_dir, modelled, time.perf_counter() - started)


def _read(run_dir: Path, modelled: torch.device, seconds: float) -> Estimate:
    from memprof.trace.reader import load_run

    rows = load_run(run_dir).iterations
    row = rows[rows.iteration == STEPS - 1].iloc[0]
    cuda = modelled.type == "cuda"
    return Estimate(
        peak_bytes=int(row.peak_allocated_bytes),
        categories_at_peak_bytes={Category(c): int(row[c]) for c in CATEGORIES},
        reserved_peak_bytes=int(row.peak_reserved_bytes) if cuda else None,
        peak_phase=str(row.peak_phase), peak_module=str(row.peak_module), device=str(modelled),
        run_dir=Path(run_dir), seconds=seconds)
