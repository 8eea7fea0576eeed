"""The algorithms behind one interface: the :class:`Solver` protocol and the registry :func:`planner.solvers.dispatch.solve`
reads.

Every algorithm is a module with the protocol's two functions; the registry says what each one is
(:class:`SolverSpec`): whether it claims an optimum (the tests hold those against an exhaustive search judged by
the simulator), whether it reads the slots of a discretised memory, and whether users pick it (``exact`` is
for tests). Where one algorithm hands a chain to another (tables too large, nothing to offload) is
:mod:`planner.solvers.handover`. Recomputation options planned by the held budget (``held``) have an interface
of their own (:func:`planner.solvers.dispatch.solve_held`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from planner.errors import UnknownAlgorithmError
from planner.model.chain import Chain
from planner.solvers import (
    binomial,
    exact,
    offload,
    periodic,
    revolve,
    rotor,
    rotor_optimal,
    selective,
    sqrt,
    store_all,
)
from planner.solvers.common import Plan

__all__ = ["ALGORITHMS", "REGISTRY", "SOLVABLE", "Solver", "SolverSpec", "lookup"]


class Solver(Protocol):
    """What every algorithm's module provides."""

    def plan(self, chain: Chain, budget_bytes: int, slots: int = ...) -> Plan:
        """The schedule's operations within the chain's own budget ``budget_bytes`` (raises
        ``InfeasibleBudgetError`` below :meth:`min_budget_bytes`)."""
        ...

    def min_budget_bytes(self, chain: Chain, slots: int = ...) -> int:
        """The smallest chain budget :meth:`plan` succeeds at."""
        ...


@dataclass(frozen=True)
class SolverSpec:
    """One algorithm in the registry.

    Attributes:
        name: the name ``solve`` takes.
        solver: its module.
        summary: what it does, in one line.
        optimal: it claims the fastest schedule within the budget among those it considers.
        slots: it solves on a grid of slots (the ``slots`` argument matters).
        for_users: listed for users (``ALGORITHMS``); ``exact`` is for tests and small chains.
    """

    name: str
    solver: Solver
    summary: str
    optimal: bool
    slots: bool
    for_users: bool = True


_SPECS = (
    SolverSpec("store_all", store_all, "PyTorch's default: record everything", False, False),
    SolverSpec("periodic", periodic, "checkpoint_sequential with the best feasible number of segments", False, False),
    SolverSpec("sqrt", sqrt, "Chen et al.: sqrt(L) segments", False, False),
    SolverSpec("revolve", revolve, "only a^l checkpoints, F_all right before each B, optimal placement", True, True),
    SolverSpec("rotor", rotor, "the persistent DP (ROTOR, Theorem 4.8)", True, True),
    SolverSpec("rotor_optimal", rotor_optimal, "the weak-persistent DP (ROTOR, Algorithms 1-2)", True, True),
    SolverSpec("binomial", binomial, "Griewank's binomial checkpointing, no table: very long chains", False, False),
    SolverSpec("offload", offload, "the persistent DP with offloading to host memory", True, True),
    SolverSpec("selective", selective, "the persistent DP over each stage's recomputation options", True, True),
    SolverSpec("exact", exact, "exhaustive search, chains of at most 8 stages", True, False, for_users=False),
)

#: Every algorithm ``solve`` takes, by name.
REGISTRY: Mapping[str, SolverSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
#: The algorithms for users, in the order the CLI and the dashboard list them.
ALGORITHMS: tuple[str, ...] = tuple(spec.name for spec in _SPECS if spec.for_users)
#: Every name ``solve`` takes.
SOLVABLE: tuple[str, ...] = tuple(REGISTRY)


def lookup(name: str) -> SolverSpec:
    """The registry's entry for ``name``.

    Raises:
        UnknownAlgorithmError: the name is not one of ``SOLVABLE`` (the message lists them).
    """
    if name not in REGISTRY:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; expected one of {', '.join(SOLVABLE)}")
    return REGISTRY[name]
