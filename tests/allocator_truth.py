"""Allocator truth on CPU, for the tests and benchmarks that hold memprof against it.

``torch.profiler.profile(profile_memory=True)`` records every allocation and free of the CPU allocator;
``prof.profiler.kineto_results.events()`` named ``[memory]`` carry them (``prof.events()`` attributes most to
operators and drops them from ``[memory]``), and summing them in time order gives the live bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def allocator_rise_bytes(call: Callable[[], Any], quiet: bool = False) -> int:
    """The highest rise of the CPU allocator's allocated bytes during ``call()`` over what it held before.

    Args:
        call: what to run under the profiler.
        quiet: ignore the warnings raised meanwhile (e.g. an estimate's workspace probes stepping aside).
    """
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            call()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak
