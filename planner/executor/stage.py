"""One stage of a scheduled chain: how the model called it, running it again, and what that must guard.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it
in the files it writes). A stage is one or more consecutive modules; the model's own ``forward`` calls its
first module with any positional and keyword arguments (the running activation among them, the rest side
inputs such as attention masks or rotary tables, kept for recomputations) and the others with the running
activation alone (in-place modules and views folded into the stage). A recomputation replays the RNG state
of the stage's first run (dropout masks match) and updates scratch copies of stateful buffers (BatchNorm
statistics move once per iteration); an in-place module applied directly to the stage's input works on a
copy, so an input the schedule keeps is never overwritten.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from planner.executor.block_io import first_tensor, same_storage, tensors_in
from planner.executor.sharded import gathered, sharded_modules

RngState = tuple[torch.Tensor, list[torch.Tensor]]


class StageRunner:
    """The modules of one stage, with the call that runs them and what running it again must guard.

    Args:
        modules: the stage's modules, in order.
        forwards: their original ``forward`` methods (the wrappers replace the modules' own).
    """

    def __init__(self, modules: Sequence[nn.Module], forwards: Sequence[Callable[..., Any]]) -> None:
        self.modules = list(modules)
        self.forwards = list(forwards)
        everything = [sub for module in self.modules for sub in module.modules()]
        self.stateful = [
            m for m in everything
            if getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None) is not None
        ]
        self.inplace = [m for m in everything if _is_inplace(m)]

    def __call__(self, x: torch.Tensor, call: StageCall,
                 carried: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, Any]:
        """Runs the stage on ``x`` with the model's other arguments (``carried``: leaves for the carried
        ones); returns the output and the raw result."""
        # FSDP2 modules are looked up at each run: fully_shard may come after apply_schedule
        with _guard_input(self.inplace, x), gathered(sharded_modules(self.modules)):
            # The modules' own forwards are called directly (not through their hooks), so the guard above only
            # reaches their submodules: an in-place module that is itself in the stage gets a copy here.
            args, kwargs = call.arguments(x.clone() if _is_inplace(self.modules[0]) else x, carried)
            raw = self.forwards[0](*args, **kwargs)
            y = first_tensor(raw)
            for module, forward in zip(self.modules[1:], self.forwards[1:]):
                if y is not None and _is_inplace(module) and same_storage(y, x):
                    y = y.clone()
                y = first_tensor(forward(y))
        if y is None:
            raise TypeError("a stage must return a tensor (alone, or first in a tuple or ModelOutput)")
        return y, raw

    @contextlib.contextmanager
    def frozen_state(self, unseen: bool = False) -> Iterator[None]:
        """Lets a recomputation update scratch copies of the stateful buffers (BatchNorm statistics).

        The originals are neither moved nor written (autograd may have saved them), so they change once per
        iteration, in the stage's first run.

        Args:
            unseen: make the copies below every active dispatch mode. A selective checkpoint's recomputation
                counts the ops it sees to find the outputs it kept; copies it saw would shift the count.
        """
        originals = [
            (module, name, buf) for module in self.stateful for name, buf in module.named_buffers(recurse=False)
        ]
        with _disable_current_modes() if unseen else contextlib.nullcontext():
            copies = [buf.clone() for _, _, buf in originals]
        for (module, name, _), copy in zip(originals, copies):
            setattr(module, name, copy)
        try:
            yield
        finally:
            for module, name, buf in originals:
                setattr(module, name, buf)


class StageCall:
    """How the model called a stage's first module: its arguments, the running activation's place left open.

    Args:
        args, kwargs: the call's arguments.
        where: the activation's position in ``args`` (an int) or its keyword (a str).

    A tensor argument that requires grad (a skip connection, an encoder's output, an embedding made before
    the chain) is *carried*: ``carried`` lists where each is and ``carried_inputs`` the tensors themselves
    (which the stage's autograd function takes as inputs, so their gradients reach their producers); the
    call keeps them detached, and a recording forward passes leaves in their place (:meth:`arguments`).
    """

    def __init__(self, args: tuple, kwargs: dict[str, Any], where: int | str) -> None:
        self.where = where
        self.carried: list[int | str] = []
        self.carried_inputs: list[torch.Tensor] = []
        places: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
        for name, value in places:
            if name == where:
                continue
            if isinstance(value, torch.Tensor) and value.requires_grad:
                self.carried.append(name)
                self.carried_inputs.append(value)
                continue
            for tensor in tensors_in(value):
                if tensor.requires_grad:
                    raise RuntimeError(
                        f"argument {name!r} of a scheduled block holds a tensor that requires grad inside a "
                        f"{type(value).__name__}; the executor carries trainable side inputs passed as tensors "
                        "directly: pass it as its own argument, or compute it under torch.no_grad()"
                    )
        self.args = tuple(None if i == where else _detached(a) for i, a in enumerate(args))
        self.kwargs = {k: (None if k == where else _detached(v)) for k, v in kwargs.items()}

    def arguments(self, x: torch.Tensor, carried: Sequence[torch.Tensor] | None = None) -> tuple[tuple, dict[str, Any]]:
        """The call's arguments with ``x`` as the running activation (and ``carried`` in the carried places)."""
        swap: dict[int | str, Any] = {self.where: x}
        if carried is not None:
            swap.update(zip(self.carried, carried))
        args = tuple(swap.get(i, a) for i, a in enumerate(self.args))
        kwargs = {k: swap.get(k, v) for k, v in self.kwargs.items()}
        if isinstance(self.where, str):
            kwargs[self.where] = x
        return args, kwargs

    def release(self) -> None:
        """Drops the carried tensors (after the stage's backward nothing runs it again)."""
        self.carried_inputs = []
        self.args = tuple(None if i in self.carried else a for i, a in enumerate(self.args))
        self.kwargs = {k: (None if k in self.carried else v) for k, v in self.kwargs.items()}


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) and value.requires_grad else value


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


def _is_inplace(module: nn.Module) -> bool:
    return getattr(module, "inplace", False) is True


def _copy_if_protected(protected: torch.Tensor, module: nn.Module, args: tuple) -> tuple | None:
    # An in-place module fed the stage's own input would overwrite a tensor the schedule keeps.
    if args and isinstance(args[0], torch.Tensor) and same_storage(args[0], protected):
        return (args[0].clone(), *args[1:])
    return None


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


def uncached_casts(state: tuple[str, bool, torch.dtype] | None) -> contextlib.AbstractContextManager:
    """Within autocast, a run whose results are not recorded keeps no cast weights.

    Autocast caches the low-precision copy of each weight it casts until the outermost autocast region ends,
    so a stage run without recording (F_ck, F_none) would leave its weights' copies alive for the whole
    forward: memory the schedule expects freed. A nested region with the cache off casts them for the run
    alone (the values, and so the gradients, are the same).
    """
    if state is None or not state[1]:
        return contextlib.nullcontext()
    device_type, _, dtype = state
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=True, cache_enabled=False)


def autocast_context(state: tuple[str, bool, torch.dtype] | None) -> contextlib.AbstractContextManager:
    """The context that restores a captured autocast setting (a no-op without one)."""
    if state is None:
        return contextlib.nullcontext()
    device_type, enabled, dtype = state
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled)
