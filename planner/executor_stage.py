"""One stage of a scheduled sequence: running it, and what running it again must guard.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export`` embeds it
in the files it writes). A recomputation replays the RNG state of the stage's first run (dropout masks match)
and updates scratch copies of stateful buffers (BatchNorm statistics move once per iteration); an in-place
module applied directly to the stage's input works on a copy, so an input the schedule keeps is never
overwritten (the copy becomes the output, which is what the cost model counts).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch
from torch import nn

RngState = tuple[torch.Tensor, list[torch.Tensor]]


class StageRunner:
    """The modules of one stage, with what running it again must guard."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = list(modules)
        everything = [sub for module in self.modules for sub in module.modules()]
        self.stateful = [
            m for m in everything
            if getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None) is not None
        ]
        self.inplace = [m for m in everything if getattr(m, "inplace", False) is True]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with _guard_input(self.inplace, x):
            for module in self.modules:
                x = module(x)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"a stage must return one tensor to be checkpointed, found {type(x).__name__}")
        return x

    @contextlib.contextmanager
    def frozen_state(self) -> Iterator[None]:
        """Lets a recomputation update scratch copies of the stateful buffers (BatchNorm statistics).

        The originals are neither moved nor written (autograd may have saved them), so they change once per
        iteration, in the stage's first run.
        """
        originals = [
            (module, name, buf) for module in self.stateful for name, buf in module.named_buffers(recurse=False)
        ]
        for module, name, buf in originals:
            setattr(module, name, buf.clone())
        try:
            yield
        finally:
            for module, name, buf in originals:
                setattr(module, name, buf)


@contextlib.contextmanager
def _guard_input(modules: Sequence[nn.Module], protected: torch.Tensor) -> Iterator[None]:
    if not modules:
        yield
        return
    hook = functools.partial(_copy_if_protected, protected)
    handles = [m.register_forward_pre_hook(hook) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _copy_if_protected(protected: torch.Tensor, module: nn.Module, args: tuple) -> tuple | None:
    # An in-place module fed the stage's own input would overwrite a tensor the schedule keeps.
    if args and isinstance(args[0], torch.Tensor) and _same_storage(args[0], protected):
        return (args[0].clone(), *args[1:])
    return None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def rng_devices(x: torch.Tensor) -> list[int]:
    """The CUDA devices whose RNG a stage fed ``x`` draws from (none on CPU)."""
    return [x.device.index or 0] if x.device.type == "cuda" else []


def capture_rng(x: torch.Tensor) -> RngState:
    """The CPU RNG state and that of ``x``'s CUDA device, as ``torch.utils.checkpoint`` saves them."""
    return torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in rng_devices(x)]


def same_rng(a: RngState, b: RngState) -> bool:
    """Whether two captured states are equal (a stage that drew no random number leaves them so)."""
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@contextlib.contextmanager
def replay_rng(state: RngState | None, x: torch.Tensor) -> Iterator[None]:
    """Runs the block from ``state`` (``None``: as is), then puts the RNG back where it was."""
    if state is None:
        yield
        return
    devices = rng_devices(x)
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.set_rng_state(state[0])
        for device, cuda_state in zip(devices, state[1]):
            torch.cuda.set_rng_state(cuda_state, device)
        yield


def autocast_state(x: torch.Tensor) -> tuple[str, bool, torch.dtype] | None:
    """The autocast setting for ``x``'s device type, to re-enter during recomputations in backward."""
    device_type = x.device.type
    try:
        return device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):  # device types or torch versions without autocast
        return None


def autocast_context(state: tuple[str, bool, torch.dtype] | None) -> contextlib.AbstractContextManager:
    """The context that restores a captured autocast setting (a no-op without one)."""
    if state is None:
        return contextlib.nullcontext()
    device_type, enabled, dtype = state
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled)
