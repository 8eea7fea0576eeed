"""A measured run's step time is timed without the profiler, kept in its meta.json, and read back by every
comparison of the run (measure_schedule's and the dashboard's)."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from examples import zoo
from memprof import load_trace
from memprof.errors import CorruptTraceError
from planner import chain_from_trace, solve, store_all_budget
from planner.executor import remove_schedule
from planner.measure.comparison import TIMED_KEY, compare, compute_ms, timed_step_ms
from planner.measure.runs import measure_schedule
from tests.memprof.helpers import profile_steps


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=4, width=64)
    out = tmp_path_factory.mktemp("timed")
    chain = chain_from_trace(profile_steps(model, make_batch, out / "profile", steps=3, batch_size=32))
    schedule = solve(chain, store_all_budget(chain), "rotor")
    trace, comparison = measure_schedule(model, make_batch, schedule, out, steps=3, batch_size=32, run_id="m",
                                         timed_steps=5)
    remove_schedule(model)
    return model, make_batch, schedule, trace, comparison, out


def test_the_timed_steps_are_the_comparisons_step_time_and_stay_with_the_run(measured) -> None:
    _, _, schedule, trace, comparison, _ = measured
    timed = trace.meta[TIMED_KEY]
    assert len(timed) == 5 and all(t > 0 for t in timed)
    assert comparison.measured_step_ms == pytest.approx(statistics.median(timed))
    assert compare(schedule, load_trace(trace.path)) == comparison  # what the dashboard reads is the same
    assert len(trace.iterations) == 3  # the timed steps ran without the profiler


def test_without_timed_steps_the_profiled_clock_is_the_step_time(measured) -> None:
    model, make_batch, schedule, _, _, out = measured
    trace, comparison = measure_schedule(model, make_batch, schedule, out, steps=3, batch_size=32, run_id="u",
                                         timed_steps=0)
    remove_schedule(model)
    assert TIMED_KEY not in trace.meta
    assert comparison.measured_step_ms == compute_ms(trace) > 0
    with pytest.raises(ValueError, match="timed_steps"):
        measure_schedule(model, make_batch, schedule, out, timed_steps=-1)


def test_a_malformed_list_of_timed_steps_is_a_corrupt_trace(measured) -> None:
    *_, trace, _, _ = measured
    assert timed_step_ms({}) == []
    for bad in ("5", [1.0, -2.0], [True], {"a": 1}):
        with pytest.raises(CorruptTraceError, match=TIMED_KEY):
            timed_step_ms({TIMED_KEY: bad})
    meta = json.loads((trace.path / "meta.json").read_text())
    assert meta[TIMED_KEY] == trace.meta[TIMED_KEY]
