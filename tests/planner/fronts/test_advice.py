"""The planner's advice for a failed run, in whole-step memory (``memprof report``, the dashboard)."""

from __future__ import annotations

import planner
from memprof import load_trace
from memprof.units import format_bytes
from planner.fronts.advice import planner_advice
from tests.dashboard.fixtures import write_profiled_run


def _failed_run(root, budget_bytes: int) -> object:
    """A run whose last iteration (2) failed; iterations 0 and 1 completed."""
    failure = {"iteration": 2, "message": "CUDA out of memory", "module": "features.3", "phase": "backward",
               "last_event": "enter", "allocated_bytes": budget_bytes - 4096, "budget_bytes": budget_bytes,
               "categories": {"weights": 1000, "feature_maps": 2000}}
    write_profiled_run(root / "failed", "failed", iterations=3, failure=failure)
    return load_trace(root / "failed")


def test_advice_gives_the_schedule_that_fits_the_whole_step(tmp_path):
    probe = _failed_run(tmp_path / "probe", 1)
    chain = planner.chain_from_trace(probe)
    low, high = planner.min_feasible_budget(chain), planner.store_all_budget(chain)
    budget = (low + high) // 2
    trace = _failed_run(tmp_path, budget)
    step = chain.step
    lines = planner_advice(trace, trace.meta["failure"])
    assert len(lines) == 2
    assert lines[0].startswith(f"  planner: chain of {chain.length} stages in '{chain.name}'; storing all "
                               f"activations, the step peaks at {format_bytes(high)} "
                               f"({format_bytes(step.base_bytes)} beside the chain")
    assert lines[0].endswith(f"the least a rotor schedule needs is {format_bytes(low)}")
    schedule = planner.solve(chain, budget)
    assert lines[1] == (f"  planner: the rotor schedule fits the {format_bytes(budget)} the step had: predicted "
                        f"step peak {format_bytes(schedule.predicted_step_peak_bytes)} (store-all "
                        f"{format_bytes(high)}), makespan {schedule.predicted_makespan_ms:.1f} ms: "
                        f"memprof plan {trace.path} --budget {budget}")
    assert schedule.predicted_step_peak_bytes <= budget


def test_advice_below_the_floor_says_what_dominates(tmp_path):
    probe = _failed_run(tmp_path / "probe", 1)
    step = planner.chain_from_trace(probe).step
    trace = _failed_run(tmp_path, step.floor_bytes - 1)
    lines = planner_advice(trace, trace.meta["failure"])
    assert lines[1].startswith(f"  planner: no schedule fits the {format_bytes(step.floor_bytes - 1)} the step had: ")
    assert step.explain_floor() in lines[1]
