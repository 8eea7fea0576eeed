"""Optimal rematerialization (activation checkpointing) schedules from memprof traces."""

from typing import TYPE_CHECKING, Any

from planner.advice import planner_advice
from planner.chain import Chain, Stage
from planner.comparison import Comparison
from planner.errors import (
    ChainError,
    ChainWarning,
    FallbackWarning,
    InfeasibleBudgetError,
    InvalidScheduleError,
    NotAChainError,
    PlannerError,
    ScheduleMismatchError,
    SearchTooLargeError,
    TableTooLargeError,
    UnknownAlgorithmError,
)
from planner.schedule import Op, OpKind, Schedule
from planner.simulator import Prediction, TimelinePoint, simulate

# Eager, and it must stay so: the function ``solve`` shares its name with its module, and importing the
# module later (``planner.solve.solver``) would otherwise leave the module where the function belongs.
from planner.solve import ALGORITHMS, min_feasible_budget, solve, solve_held, store_all_budget
from planner.step import StepCosts
from planner.transfer import DEFAULT_TRANSFER, TransferCosts
from planner.weights import WeightCosts

if TYPE_CHECKING:
    from planner.executor import CheckpointedSequential, apply_schedule, remove_schedule
    from planner.export import export_json, export_python
    from planner.from_trace import chain_from_trace
    from planner.pareto import ParetoFront, pareto_front
    from planner.points import algorithm_points
    from planner.transfer_measure import measure_transfer_bandwidth

# Imported on first use: the executor and the export import torch, and reading a trace and the Pareto
# tables pandas; loading a chain from JSON, solving and simulating need neither.
_LAZY = {
    "CheckpointedSequential": "planner.executor",
    "ParetoFront": "planner.pareto",
    "algorithm_points": "planner.points",
    "apply_schedule": "planner.executor",
    "chain_from_trace": "planner.from_trace",
    "measure_transfer_bandwidth": "planner.transfer_measure",
    "export_json": "planner.export",
    "export_python": "planner.export",
    "pareto_front": "planner.pareto",
    "remove_schedule": "planner.executor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


__all__ = [
    "ALGORITHMS",
    "Chain",
    "ChainError",
    "ChainWarning",
    "CheckpointedSequential",
    "Comparison",
    "DEFAULT_TRANSFER",
    "FallbackWarning",
    "InfeasibleBudgetError",
    "InvalidScheduleError",
    "NotAChainError",
    "Op",
    "OpKind",
    "ParetoFront",
    "PlannerError",
    "Prediction",
    "Schedule",
    "ScheduleMismatchError",
    "SearchTooLargeError",
    "Stage",
    "StepCosts",
    "TableTooLargeError",
    "TimelinePoint",
    "TransferCosts",
    "UnknownAlgorithmError",
    "WeightCosts",
    "algorithm_points",
    "apply_schedule",
    "chain_from_trace",
    "export_json",
    "export_python",
    "measure_transfer_bandwidth",
    "min_feasible_budget",
    "pareto_front",
    "planner_advice",
    "remove_schedule",
    "simulate",
    "solve",
    "solve_held",
    "store_all_budget",
]
