"""Analysis: from one iteration's raw record to the rows of the trace tables.

Torch-free and pandas-free on purpose: the background worker runs it without importing either
(``tests/memprof/test_imports.py`` checks). The flow is :mod:`~memprof.analysis.records` (the seam
with capture) -> :mod:`~memprof.analysis.attribution` (each block's category) ->
:mod:`~memprof.analysis.timeline` and :mod:`~memprof.analysis.layers` (event and layer rows), run per
iteration by :mod:`~memprof.analysis.iteration`, which keeps the detail :mod:`~memprof.analysis.detail` chooses.

Public names load on first use, so importing one module does not load the others.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.analysis.console import format_failure, format_report
    from memprof.analysis.detail import DetailPolicy
    from memprof.analysis.iteration import IterationProcessor, ProcessedIteration
    from memprof.analysis.records import (
        AllocationEvents,
        CarriedState,
        Drained,
        IterationRecord,
        Mark,
        RunSpec,
    )

_LAZY = {
    "AllocationEvents": "memprof.analysis.records",
    "CarriedState": "memprof.analysis.records",
    "DetailPolicy": "memprof.analysis.detail",
    "Drained": "memprof.analysis.records",
    "IterationProcessor": "memprof.analysis.iteration",
    "IterationRecord": "memprof.analysis.records",
    "Mark": "memprof.analysis.records",
    "ProcessedIteration": "memprof.analysis.iteration",
    "RunSpec": "memprof.analysis.records",
    "format_failure": "memprof.analysis.console",
    "format_report": "memprof.analysis.console",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AllocationEvents",
    "CarriedState",
    "DetailPolicy",
    "Drained",
    "IterationProcessor",
    "IterationRecord",
    "Mark",
    "ProcessedIteration",
    "RunSpec",
    "format_failure",
    "format_report",
]
