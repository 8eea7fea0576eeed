"""The simulator is the one judge of a schedule's memory: ``solve``, ``simulate``, the export and the fronts give
the same peak, to the byte, carried tensors included."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import Chain, Stage, min_feasible_budget, simulate, solve, store_all_budget
from planner.export.files import export_json
from planner.fronts.pareto import peak_and_makespan
from planner.model.carried_tensor import Carried
from planner.simulation.simulator import predict
from tests.planner.chain_strategies import offload_chains, option_chains, small_chains

ALGORITHMS = ("store_all", "rotor", "revolve", "binomial", "periodic")


def _issue_chain() -> Chain:
    """Six stages (a = 100 B, a-bar = 200 B, delta = 100 B) and a 500-byte tensor made by stage 1, read by 5."""
    stages = tuple(Stage(1.0, 2.0, 100, 200, 100, name=f"s{i}") for i in range(1, 7))
    return Chain("skip", 100, (*stages, Stage(0.0, 0.0, 0, 0, 0, name="loss")),
                 carried=(Carried(1, (5,), 500, "s1"),))


def _agree(chain: Chain, schedule) -> int:  # noqa: ANN001
    prediction = simulate(chain, schedule)
    assert schedule.predicted_peak_bytes == prediction.peak_bytes
    assert predict(chain, schedule.ops)[0] == prediction.peak_bytes
    assert peak_and_makespan(chain, schedule.ops)[0] == prediction.peak_bytes
    assert json.loads(export_json(schedule))["predicted_peak_bytes"] == prediction.peak_bytes
    assert max(p.peak_bytes for p in prediction.timeline) == prediction.peak_bytes  # the timeline shows it
    return prediction.peak_bytes


def test_the_skip_of_the_issue_is_counted_by_every_caller() -> None:
    chain = _issue_chain()
    # store-all keeps a^1 inside a-bar^1: the skip costs only its gradient, from B(5) to B(2)
    assert _agree(chain, solve(chain, 1600, "store_all")) == 1600
    rotor = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    assert _agree(chain, rotor) == 1100  # (simulate said 600 before it counted the skip)


@settings(max_examples=60, deadline=None)
@given(chain=small_chains(max_length=5), data=st.data())
def test_every_caller_reads_the_simulators_peak(chain: Chain, data: st.DataObject) -> None:
    length = chain.length
    if length >= 2:
        producer = data.draw(st.integers(0, length - 2))
        consumers = data.draw(st.lists(st.integers(producer + 2, length), min_size=1, max_size=2, unique=True))
        size = data.draw(st.integers(0, 8))
        chain = Chain(chain.name, chain.input_bytes, chain.stages,
                      carried=(Carried(producer, tuple(consumers), size, "skip", data.draw(st.booleans())),))
    algorithm = data.draw(st.sampled_from(ALGORITHMS))
    budget = store_all_budget(chain) if algorithm == "store_all" else min_feasible_budget(chain, algorithm)
    try:
        schedule = solve(chain, budget, algorithm, slots=64)
    except Exception as error:  # noqa: BLE001
        pytest.fail(f"{algorithm} at its own minimum budget {budget}: {error}")
    assert _agree(chain, schedule) <= budget


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_options_and_offloads_are_read_from_the_simulator_too(data: st.DataObject) -> None:
    algorithm = data.draw(st.sampled_from(["selective", "offload"]))
    chain = data.draw(option_chains() if algorithm == "selective" else offload_chains())
    if chain.length >= 2 and data.draw(st.booleans()):
        chain = Chain(chain.name, chain.input_bytes, chain.stages, transfer=chain.transfer,
                      carried=(Carried(1, (chain.length,), data.draw(st.integers(0, 8)), "skip"),))
    low = min_feasible_budget(chain, algorithm, slots=64)
    budget = data.draw(st.integers(low, low + 12))
    assert _agree(chain, solve(chain, budget, algorithm, slots=64)) <= budget


def test_the_old_carried_helpers_still_answer() -> None:
    from planner.simulation import carried_memory
    from planner.solvers import carried_fit as carried

    chain = _issue_chain()
    prediction = simulate(chain, solve(chain, min_feasible_budget(chain, "rotor"), "rotor"))
    with pytest.warns(DeprecationWarning, match="simulate\\(\\) counts the carried tensors itself"):
        assert carried.peak_of(chain, prediction) == prediction.peak_bytes == 1100
    assert carried.extra_bytes(chain, prediction) == carried_memory.extra_bytes(chain, prediction.timeline)
    assert any(carried.extra_bytes(chain, prediction))  # the skip is held somewhere in this schedule
