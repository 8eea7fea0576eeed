"""Optimal rematerialization (activation checkpointing) schedules from memprof traces."""

from planner.chain import Chain, Stage
from planner.errors import (
    ChainError,
    InfeasibleBudgetError,
    InvalidScheduleError,
    NotAChainError,
    PlannerError,
    ScheduleMismatchError,
    UnknownAlgorithmError,
)
from planner.schedule import Op, OpKind, Schedule

__all__ = [
    "Chain",
    "ChainError",
    "InfeasibleBudgetError",
    "InvalidScheduleError",
    "NotAChainError",
    "Op",
    "OpKind",
    "PlannerError",
    "Schedule",
    "ScheduleMismatchError",
    "Stage",
    "UnknownAlgorithmError",
]
