"""Phase times in ``meta.json``: what the profiler writes reads back, and a malformed entry is a clear error."""

from __future__ import annotations

import pytest

from memprof.analysis.phase_times import META_KEY, PhaseTime, phase_times_from_meta, phase_times_to_meta
from memprof.errors import CorruptTraceError


def _time(iteration: int, steady: bool = False, forward: float = 2.0) -> PhaseTime:
    return PhaseTime(iteration=iteration, steady=steady, host_forward_ms=forward * 2, host_backward_ms=3.0,
                     forward_ms=forward, backward_ms=2.5)


def test_phase_times_read_back_as_written_in_iteration_order() -> None:
    times = [_time(3, steady=True), _time(1)]
    clock, read = phase_times_from_meta({META_KEY: phase_times_to_meta("cuda", times)})
    assert clock == "cuda"
    assert read == (_time(1), _time(3, steady=True))


def test_a_run_without_phase_times_reads_as_none() -> None:
    assert phase_times_from_meta({"model": "Sequential"}) == ("host", ())


@pytest.mark.parametrize("raw", [
    {"clock": "tpu", "iterations": []},
    {"iterations": []},
    {"clock": "host", "iterations": [{"iteration": 1}]},
    {"clock": "host", "iterations": [{**phase_times_to_meta("host", [_time(1)])["iterations"][0], "forward_ms": -1}]},
    {"clock": "host", "iterations": "none"},
])
def test_malformed_phase_times_are_a_corrupt_trace_that_says_how_to_go_on(raw) -> None:
    with pytest.raises(CorruptTraceError, match="remove the key"):
        phase_times_from_meta({META_KEY: raw})


def test_a_phase_time_rejects_what_no_clock_measures() -> None:
    with pytest.raises(ValueError, match="forward_ms"):
        PhaseTime(iteration=0, steady=False, host_forward_ms=1.0, host_backward_ms=1.0, forward_ms=float("nan"),
                  backward_ms=1.0)
    with pytest.raises(ValueError, match="iteration"):
        _time(-1)
    with pytest.raises(ValueError, match="clock"):
        phase_times_to_meta("tpu", [])
