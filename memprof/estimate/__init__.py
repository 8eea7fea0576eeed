"""Predicting a training step's memory before running it, on fake tensors (see :func:`estimate`)."""

from typing import TYPE_CHECKING, Any

from memprof.errors import EstimateError

if TYPE_CHECKING:
    from memprof.estimate.run import Estimate, estimate

# Imported on first use: the estimate imports torch and the profiler.
_LAZY = {"Estimate": "memprof.estimate.run", "estimate": "memprof.estimate.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprof.estimate' has no attribute {name!r}")


__all__ = ["Estimate", "EstimateError", "estimate"]
