"""The registry: every algorithm behind the Solver interface, and each one that claims an optimum never slower,
judged by the simulator, than the algorithms whose schedules it considers."""

from __future__ import annotations

import pkgutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.solvers
from planner import Chain, min_feasible_budget, simulate, solve
from planner.errors import InfeasibleBudgetError, UnknownAlgorithmError
from planner.solvers import exact
from planner.solvers.dispatch import ALGORITHMS, solver
from planner.solvers.registry import REGISTRY, SOLVABLE, lookup
from tests.planner.chain_strategies import option_chains, small_chains

#: Modules under planner/solvers/ that are not algorithms ``solve`` takes: shared parts, the slow twins, and
#: ``held`` (planned by a held budget, ``solve_held``).
NOT_ALGORITHMS = {"budget_grid", "common", "option_grid", "binomial_split", "rotor_fill", "offload_fill", "held",
                  "registry", "handover", "discretize", "dispatch", "carried_fit", "weight_plan", "loss_choice",
                  "reference"}
#: For each algorithm that claims an optimum, the algorithms whose schedules are among those it considers.
WITHIN = {
    "rotor": ("store_all", "periodic", "sqrt", "binomial", "revolve"),
    "rotor_optimal": ("store_all", "periodic", "sqrt", "binomial", "revolve", "rotor"),
    "selective": ("store_all", "periodic", "sqrt", "binomial", "revolve", "rotor"),
}  # (revolve's schedules record each stage right before its backward: binomial's are not among them)


def test_every_algorithm_module_is_registered_behind_the_interface() -> None:
    modules = {m.name for m in pkgutil.iter_modules(planner.solvers.__path__)}
    algorithms = modules - NOT_ALGORITHMS
    assert algorithms == set(REGISTRY) == set(SOLVABLE)
    assert set(ALGORITHMS) == set(SOLVABLE) - {"exact"}
    for name, spec in REGISTRY.items():
        assert spec.name == name and solver(name).module is spec.solver  # with the handover's turns
        assert callable(spec.solver.plan) and callable(spec.solver.min_budget_bytes)
    assert set(WITHIN) <= {name for name, spec in REGISTRY.items() if spec.optimal}


def test_an_unknown_name_lists_the_algorithms() -> None:
    with pytest.raises(UnknownAlgorithmError, match="expected one of store_all, periodic"):
        lookup("chen")


@settings(max_examples=100, deadline=None)
@given(chain=small_chains(max_length=5), data=st.data())
def test_an_optimum_is_never_slower_than_what_it_considers(chain: Chain, data: st.DataObject) -> None:
    best = data.draw(st.sampled_from(sorted(WITHIN)))
    low = min_feasible_budget(chain, best)
    budget = data.draw(st.integers(low, low + 12))
    ours = simulate(chain, solve(chain, budget, best))
    assert ours.peak_bytes <= budget
    for other in WITHIN[best]:
        try:
            theirs = simulate(chain, solve(chain, budget, other))
        except InfeasibleBudgetError:
            continue
        assert theirs.peak_bytes <= budget
        assert ours.makespan_ms <= theirs.makespan_ms + 1e-9, (best, other, budget)


#: Each algorithm that claims an optimum, and whether the exhaustive search over what it claims to beat is
#: restricted to persistent sequences (ROTOR's Definition 4.1): rotor and selective are optimal among those,
#: rotor_optimal among a larger family (weak persistence) that contains them.
AGAINST_EXHAUSTIVE = {"rotor": True, "rotor_optimal": True, "selective": True}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_no_sequence_the_exhaustive_search_finds_is_faster(data: st.DataObject) -> None:
    """The DPs against :mod:`planner.solvers.exact`, which applies the simulator's own rules in exact bytes:
    at a budget the DP solves on one-byte slots, nothing that search finds is faster within the budget, and
    the DP's schedule, replayed by the simulator, stays within the budget too."""
    algorithm = data.draw(st.sampled_from(sorted(AGAINST_EXHAUSTIVE)))
    # Only selective plans with recomputation options; the search would use them against the others.
    chain = data.draw(option_chains(max_length=3, max_size=4, max_options=2) if algorithm == "selective"
                      else small_chains(max_length=3, max_size=4))
    lowest = exact.min_budget_bytes(chain, persistent=True)
    budget = data.draw(st.integers(lowest, lowest + 8))
    best = exact.search(chain, budget, persistent=AGAINST_EXHAUSTIVE[algorithm])
    assert best is not None  # the budget is at least the persistent minimum
    try:
        ours = simulate(chain, solve(chain, budget, algorithm, slots=max(budget, 1)))
    except InfeasibleBudgetError:
        pytest.fail(f"{algorithm} found nothing at {budget} B where the exhaustive search found {best.makespan_ms} ms")
    assert ours.peak_bytes <= budget
    assert ours.makespan_ms <= best.makespan_ms + 1e-6, (algorithm, budget, ours.makespan_ms, best.makespan_ms)
