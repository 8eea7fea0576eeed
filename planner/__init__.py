"""Optimal rematerialization (activation checkpointing) schedules from memprof traces."""

from typing import TYPE_CHECKING, Any

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
from planner.fronts.advice import planner_advice
from planner.measure.comparison import Comparison, compare
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.schedule_params import ScheduleParams
from planner.model.signature import ModelSignature
from planner.model.step import StepCosts
from planner.model.transfer import DEFAULT_TRANSFER, TransferCosts
from planner.model.weights import WeightCosts
from planner.simulation.simulator import Prediction, TimelinePoint, simulate
from planner.solvers.discretize import DEFAULT_SLOTS
from planner.solvers.dispatch import (
    ALGORITHMS,
    min_feasible_budget,
    solve,
    solve_held,
    solver,
    store_all_budget,
)

if TYPE_CHECKING:
    from planner.discovery.costed import chain_inputs
    from planner.discovery.from_trace import chain_from_trace
    from planner.executor import CheckpointedSequential, apply_schedule, remove_schedule
    from planner.export.files import export_json, export_python
    from planner.fronts.pareto import ParetoFront, pareto_front
    from planner.fronts.points import algorithm_points, has_options
    from planner.measure.bandwidth import measure_transfer_bandwidth
    from planner.measure.batch_fit import Planned, largest_fitting, planned_fit
    from planner.measure.compile_baseline import (
        COMPILE_BUDGETS,
        COMPILE_POINTS_FILE,
        CompilePoint,
        measure_compile,
        read_compile_points,
        write_compile_points,
    )
    from planner.measure.runs import measure_schedule

# Imported on first use: the executor and the export import torch, and reading a trace and the Pareto
# tables pandas; loading a chain from JSON, solving and simulating need neither.
_LAZY = {
    "COMPILE_BUDGETS": "planner.measure.compile_baseline",
    "COMPILE_POINTS_FILE": "planner.measure.compile_baseline",
    "CompilePoint": "planner.measure.compile_baseline",
    "Planned": "planner.measure.batch_fit",
    "has_options": "planner.fronts.points",
    "largest_fitting": "planner.measure.batch_fit",
    "measure_compile": "planner.measure.compile_baseline",
    "measure_schedule": "planner.measure.runs",
    "planned_fit": "planner.measure.batch_fit",
    "read_compile_points": "planner.measure.compile_baseline",
    "write_compile_points": "planner.measure.compile_baseline",
    "CheckpointedSequential": "planner.executor",
    "ParetoFront": "planner.fronts.pareto",
    "algorithm_points": "planner.fronts.points",
    "apply_schedule": "planner.executor",
    "chain_from_trace": "planner.discovery.from_trace",
    "chain_inputs": "planner.discovery.costed",
    "measure_transfer_bandwidth": "planner.measure.bandwidth",
    "export_json": "planner.export.files",
    "export_python": "planner.export.files",
    "pareto_front": "planner.fronts.pareto",
    "remove_schedule": "planner.executor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


__all__ = [
    "ALGORITHMS",
    "COMPILE_BUDGETS",
    "COMPILE_POINTS_FILE",
    "Chain",
    "ChainError",
    "ChainWarning",
    "CheckpointedSequential",
    "Comparison",
    "CompilePoint",
    "DEFAULT_SLOTS",
    "DEFAULT_TRANSFER",
    "FallbackWarning",
    "InfeasibleBudgetError",
    "InvalidScheduleError",
    "ModelSignature",
    "NotAChainError",
    "Op",
    "OpKind",
    "ParetoFront",
    "Planned",
    "PlannerError",
    "Prediction",
    "Schedule",
    "ScheduleMismatchError",
    "ScheduleParams",
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
    "chain_inputs",
    "compare",
    "export_json",
    "export_python",
    "has_options",
    "largest_fitting",
    "measure_compile",
    "measure_schedule",
    "measure_transfer_bandwidth",
    "min_feasible_budget",
    "pareto_front",
    "planned_fit",
    "planner_advice",
    "read_compile_points",
    "remove_schedule",
    "simulate",
    "solve",
    "solve_held",
    "solver",
    "store_all_budget",
    "write_compile_points",
]
