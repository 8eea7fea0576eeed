"""The recorded example shipped in traces/example stays loadable and consistent."""

from __future__ import annotations

from pathlib import Path

from memprof import load_trace
from planner import chain_from_trace
from tests.memprof.helpers import CATEGORIES

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "example"


def test_example_trace_loads_and_sums():
    trace = load_trace(EXAMPLE)
    assert trace.meta["status"] == "closed" and len(trace.iterations) == trace.meta["iterations"] > 0
    assert (trace.events[CATEGORIES].sum(axis=1) == trace.events.allocated_bytes).all()
    assert chain_from_trace(trace, "features").length == 4
