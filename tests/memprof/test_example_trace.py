"""The recorded example shipped in traces/example stays loadable and consistent."""

from __future__ import annotations

from pathlib import Path

from examples import zoo
from memprof import load_trace
from planner import chain_from_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "example"


def test_example_trace_loads_and_sums():
    trace = load_trace(EXAMPLE)
    assert trace.meta["status"] == "closed" and len(trace.iterations) == trace.meta["iterations"] > 0
    # scripts/make_example_trace.py's model: its weights and buffers to the byte, Adam's two moments once stepped
    model, _ = zoo.cnn(channels=16, blocks=4, image=32)
    weights = sum(p.numel() * 4 for p in model.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    assert (trace.events.weights == weights).all() and (trace.events.buffers == buffers).all()
    later = trace.iterations[trace.iterations.iteration >= 1]
    assert (later.optimizer_state >= 2 * weights).all() and (later.optimizer_state < 2 * weights + 1024).all()
    assert chain_from_trace(trace, "features").length == 4
