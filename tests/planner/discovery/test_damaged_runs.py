"""A run with a damaged part is planned from what is intact, never silently from less: the chain's structure and
the step around it come from the last iteration whose timeline survived (issue 51: a damaged page in the last
iteration's events made ``memprof plan`` fall back to a chain without the step, with no word)."""

from __future__ import annotations

import warnings
from pathlib import Path

from memprof import load_trace
from memprof.trace.parts import table_parts
from planner import chain_from_trace
from planner.discovery.costed import structure_iteration
from tests.cli.test_run_health import _damage_page  # a page damaged behind a sound footer
from tests.dashboard.fixtures import write_profiled_run


def _chain(run: Path):  # noqa: ANN202
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(run)
        chain = chain_from_trace(trace)
    return trace, chain, [str(w.message) for w in caught if "damaged part" in str(w.message)]


def test_a_lost_timeline_of_the_last_iteration_plans_from_the_one_before(tmp_path: Path) -> None:
    write_profiled_run(tmp_path / "whole", "whole", iterations=3)
    write_profiled_run(tmp_path / "two", "two", iterations=2)  # what iterations 0 and 1 alone give
    write_profiled_run(tmp_path / "hurt", "hurt", iterations=3)
    _damage_page(table_parts(tmp_path / "hurt", "events")[-1])  # iteration 2's timeline
    _, whole, _ = _chain(tmp_path / "whole")
    _, two, _ = _chain(tmp_path / "two")
    trace, hurt, said = _chain(tmp_path / "hurt")
    assert structure_iteration(trace) == [1]
    assert said and "iteration 2" in said[0]  # the reader says what was lost
    assert hurt.step is not None and hurt.step == two.step  # the step, from iteration 1's timeline
    assert [s.modules for s in hurt.stages] == [s.modules for s in whole.stages]


def test_an_intact_run_plans_from_its_last_iteration(tmp_path: Path) -> None:
    write_profiled_run(tmp_path / "run", "run", iterations=3)
    trace, chain, said = _chain(tmp_path / "run")
    assert structure_iteration(trace) == [2] and not said and chain.step is not None
