"""Finding the ``torch.optim.Optimizer`` inside the wrappers that trainers hand out.

Trainers wrap the user's optimizer: accelerate's ``AcceleratedOptimizer`` (what the Hugging Face
``Trainer`` holds) and DeepSpeed's optimizers keep it as ``.optimizer``, Lightning's
``LightningOptimizer`` as ``._optimizer``. The profiler hooks the optimizer's step and reads its state,
so it needs the object whose ``register_step_pre_hook`` works and whose ``step`` really runs: the
innermost one. ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer`` without calling its
``__init__``, so it has the method but not the hook tables the method writes to.
"""

from __future__ import annotations

from typing import Any

import torch

from memprof.errors import ProfilerError

__all__ = ["unwrap_optimizer"]

_INNER_NAMES = ("optimizer", "_optimizer")  # accelerate and DeepSpeed; Lightning
_MAX_DEPTH = 8  # wrappers seen in practice nest two deep (Lightning over accelerate); a cycle stops here


def _hookable(obj: Any) -> bool:
    """Whether step hooks can be registered on ``obj`` (it ran ``Optimizer.__init__``)."""
    return isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "_optimizer_step_pre_hooks")


def _inner(obj: Any) -> Any:
    """The optimizer ``obj`` wraps, or ``None``."""
    for name in _INNER_NAMES:
        try:
            value = getattr(obj, name, None)
        except Exception:  # a wrapper's property may raise before it is set up: not a wrapper then
            continue
        if value is not None and value is not obj and hasattr(value, "param_groups"):
            return value
    return None


def _state(obj: Any) -> Any:
    try:
        return obj.state
    except Exception:  # nothing to compare: treat it as not sharing the inner state
        return None


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` that ``optimizer`` is or wraps.

    A hookable optimizer that holds another one is kept as it is when its state is its own (an
    optimizer built on a base optimizer, e.g. Lookahead, keeps state of its own); it is unwrapped when
    its ``state`` is the inner one's (a wrapper that only forwards, such as ``LightningOptimizer``).

    Args:
        optimizer: a ``torch.optim.Optimizer``, a wrapper holding one as ``.optimizer`` or
            ``._optimizer`` (nested wrappers too), or ``None``.

    Returns:
        The optimizer to hook, or ``None`` when ``optimizer`` is ``None``.

    Raises:
        ProfilerError: no ``torch.optim.Optimizer`` with working step hooks was found inside.
    """
    if optimizer is None:
        return None
    current = optimizer
    for _ in range(_MAX_DEPTH):
        inner = _inner(current)
        if inner is None or (_hookable(current) and _state(current) is not _state(inner)):
            break
        current = inner
    if not _hookable(current):
        raise ProfilerError(
            f"memprof cannot hook the step of {type(optimizer).__name__}: it is not a torch.optim.Optimizer and "
            "holds none as .optimizer or ._optimizer. Pass the torch.optim.Optimizer it wraps "
            "(MemoryProfiler(model, optimizer=<the torch optimizer>)), or no optimizer at all")
    return current
