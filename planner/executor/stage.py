"""One stage of a scheduled chain: how the model called it, running it again, and what that must guard.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export`` embeds it
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
        with _guard_input(self.inplace, x):
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


def key_value_cache(args: tuple, kwargs: dict[str, Any]) -> str | None:
    """The class name of a Hugging Face key/value cache among a call's arguments (``DynamicCache``), if any.

    Found by its base class's name and module, so the runtime needs no ``transformers`` import.
    """
    for value in (*args, *kwargs.values()):
        if any(k.__name__ == "Cache" and k.__module__.startswith("transformers") for k in type(value).__mro__):
            return type(value).__name__
    return None


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


def find_activation(args: tuple, kwargs: dict[str, Any], previous: torch.Tensor | None) -> tuple[torch.Tensor, int | str]:
    """The running activation among a call's arguments and where it is.

    It is the argument that shares storage with ``previous`` (the last stage's output) when given, else the
    first tensor argument (positional first).

    Raises:
        TypeError: no tensor argument.
    """
    places: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
    tensors = [(where, value) for where, value in places if isinstance(value, torch.Tensor)]
    if previous is not None:
        for where, value in tensors:
            if same_storage(value, previous):
                return value, where
    if not tensors:
        raise TypeError("a scheduled block must receive its input activation as a tensor argument")
    where, value = tensors[0]
    return value, where


def first_tensor(value: Any) -> torch.Tensor | None:
    """The tensor a block's result carries as its output: itself, or the first of a tuple or ModelOutput."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


def reshaped_input(stage: int, x: torch.Tensor, previous: torch.Tensor) -> torch.Size | None:
    """The shape stage ``stage`` receives the previous stage's output in (``None``: as it is).

    A stage's recomputations start from the previous stage's output, so anything the model computed in
    between would be skipped: only the output itself or a reshape of it (a flatten) is accepted.

    Raises:
        RuntimeError: ``x`` is another tensor, or a view that is not a reshape (a transpose, a slice).
    """
    if not same_storage(x, previous) or x.storage_offset() != previous.storage_offset():
        raise RuntimeError(
            f"stage {stage} received a tensor other than stage {stage - 1}'s output: the model computes something "
            "between the two blocks, which a recomputation would skip; plan a chain whose blocks pass their "
            "outputs on directly (name another container, or the checkpoints)"
        )
    if x.shape == previous.shape and x.stride() == previous.stride():
        return None
    if x.numel() != previous.numel() or not _is_reshape(x, previous):
        raise RuntimeError(
            f"stage {stage} received a tensor of shape {tuple(x.shape)} (strides {x.stride()}) from stage "
            f"{stage - 1}'s output of shape {tuple(previous.shape)}; the executor supports reshapes between stages "
            "only (not a transpose or a slice)"
        )
    return x.shape


def _is_reshape(x: torch.Tensor, previous: torch.Tensor) -> bool:
    """Whether ``x`` is ``previous`` viewed in another shape, element order kept."""
    try:
        return previous.view(x.shape).stride() == x.stride()
    except RuntimeError:  # not viewable in that shape: x is a transposed or strided view
        return False


def secondary_outputs(value: Any) -> list[torch.Tensor]:
    """A block result's floating-point tensors besides its output (top-level items of a tuple, list or dict).

    T5's blocks return the position bias the first one computes and the others read: the runtime returns
    these through the stage's autograd function, so their gradients reach ``B(l)``.
    """
    if isinstance(value, torch.Tensor):
        return []
    items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (tuple, list)) else []
    first = first_tensor(value)
    return [t for t in items if isinstance(t, torch.Tensor) and t is not first and t.is_floating_point()]


def replace_outputs(value: Any, new: torch.Tensor, secondary: Sequence[torch.Tensor]) -> Any:
    """``value`` with its output (:func:`first_tensor`) replaced by ``new`` and its :func:`secondary_outputs`,
    in order, by ``secondary``; its other tensors are returned detached."""
    if isinstance(value, torch.Tensor):
        return new
    first = first_tensor(value)
    swap = {id(old): fresh for old, fresh in zip(secondary_outputs(value), secondary)}

    def fresh(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            return item
        return new if item is first else swap.get(id(item), item.detach())

    if isinstance(value, dict):
        out = value.__class__(**value) if hasattr(value, "to_tuple") else value.__class__(value)
        for key, item in value.items():
            out[key] = fresh(item)
        return out
    items = [fresh(item) for item in value]
    return tuple(items) if isinstance(value, tuple) else items


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument: itself, or inside tuples, lists and dicts (one level deep and nested)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


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


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share one storage (views of one another)."""
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
