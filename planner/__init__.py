"""Optimal rematerialization (activation checkpointing) schedules from memprof traces."""

from planner.advice import planner_advice
from planner.chain import Chain, Stage
from planner.errors import (
    ChainError,
    ChainWarning,
    InfeasibleBudgetError,
    InvalidScheduleError,
    NotAChainError,
    PlannerError,
    ScheduleMismatchError,
    UnknownAlgorithmError,
)
from planner.executor import CheckpointedSequential, apply_schedule, remove_schedule
from planner.export import export_json, export_python
from planner.pareto import ParetoFront, algorithm_points, pareto_front
from planner.schedule import Op, OpKind, Schedule
from planner.simulator import Prediction, TimelinePoint, simulate
from planner.solve import ALGORITHMS, min_feasible_budget, solve, store_all_budget
from planner.step import StepCosts

__all__ = [
    "CheckpointedSequential",
    "apply_schedule",
    "remove_schedule",
    "export_json",
    "export_python",
    "ALGORITHMS",
    "Chain",
    "ChainError",
    "ChainWarning",
    "InfeasibleBudgetError",
    "InvalidScheduleError",
    "NotAChainError",
    "Op",
    "OpKind",
    "PlannerError",
    "Schedule",
    "ScheduleMismatchError",
    "Stage",
    "StepCosts",
    "UnknownAlgorithmError",
    "ParetoFront",
    "Prediction",
    "TimelinePoint",
    "algorithm_points",
    "min_feasible_budget",
    "pareto_front",
    "planner_advice",
    "simulate",
    "solve",
    "store_all_budget",
]
