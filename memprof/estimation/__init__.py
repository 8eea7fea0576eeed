"""Predicting a training step's memory before running it, on fake tensors.

The function is ``memprof.estimate`` (:func:`memprof.estimation.run.estimate`); this package holds its parts:
the fake allocation stream, the fake twins of a model, the CUDA caching-allocator model, the CPU kernels'
workspace probe and the virtual clock.
"""

from typing import TYPE_CHECKING, Any

from memprof.errors import EstimateError

if TYPE_CHECKING:
    from memprof.estimation.run import Estimate, estimate

# Imported on first use: the estimate imports torch and the profiler.
_LAZY = {"Estimate": "memprof.estimation.run", "estimate": "memprof.estimation.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprof.estimation' has no attribute {name!r}")


__all__ = ["Estimate", "EstimateError", "estimate"]
