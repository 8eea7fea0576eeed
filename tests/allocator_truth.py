"""Allocator truth on CPU, for the tests and benchmarks that hold memprof against it.

``torch.profiler.profile(profile_memory=True)`` records every allocation and free of the CPU allocator;
``prof.profiler.kineto_results.events()`` named ``[memory]`` carry them (``prof.events()`` attributes most to
operators and drops them from ``[memory]``), and summing them in time order gives the live bytes
(:func:`planner.measure.compile_baseline.memory_events`, which also keeps Python's cycle collector out of the window).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from planner.measure.compile_baseline import memory_events, running_peak


def allocator_rise_bytes(call: Callable[[], Any], quiet: bool = False) -> int:
    """The highest rise of the CPU allocator's allocated bytes during ``call()`` over what it held before.

    Args:
        call: what to run under the profiler.
        quiet: ignore the warnings raised meanwhile (e.g. an estimate's workspace probes stepping aside).
    """
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        _, deltas = memory_events(call)
    return running_peak(deltas)[0]
