"""The whole training step around a chain: what a budget means for a chain built from a trace.

A training step holds more than the chain's activations: the model's weights and buffers, the optimizer's
state, the batch, tensors every block receives (attention masks, rotary tables), activations of the
modules before the chain, and at its end the parameter gradients and the optimizer step's temporaries.
:class:`StepCosts` carries those, measured from the trace, so that a schedule predicts the peak of the
whole step:

    step peak = max(before_peak, base + chain peak, after_peak)

where the chain's peak is the simulator's (the modules after the chain -- head and loss -- are the chain's
loss stage, and each ``B(l)`` adds its parameter gradients), ``base`` is what stays allocated beside the
chain from its first forward to its last backward, ``before_peak`` is the step's peak before the chain
starts (the stem's forward) and ``after_peak`` its peak after the chain's last backward (the stem's
backward and the optimizer step). A budget for such a chain is the whole step's memory, what the device
has; the chain's own budget (the paper's M) is ``budget - base``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from memprof.units import format_bytes
from planner.errors import ChainError, InfeasibleBudgetError


@dataclass(frozen=True)
class StepCosts:
    """What a training step holds besides one chain's activations (bytes).

    Attributes:
        model_state_bytes: weights, buffers, optimizer state and parameter gradients already held when the
            chain starts (``zero_grad(set_to_none=False)``), allocated through the chain's span.
        inputs_bytes: the batch.
        outside_bytes: everything else held beside the chain through its span: activations of the modules
            before it, tensors every block receives (masks, position tables), the chain's input when the
            modules before the chain keep it too.
        before_peak_bytes: the step's peak before the chain's first forward (zero_grad, the stem).
        after_peak_bytes: the step's peak after the chain's last backward (the stem's backward, the
            optimizer step).
        optimizer_step_bytes: the optimizer step's transient above what was allocated when it started.
        weights_bytes: the weights and buffers alone (part of ``model_state_bytes``), for explanations.
        optimizer_state_bytes: the optimizer's state alone (part of ``model_state_bytes``).
        weight_grad_bytes: all parameter gradients at the end of backward.
        optimizer_peak_bytes: the step's peak during the optimizer step (0: unknown).
    """

    model_state_bytes: int
    inputs_bytes: int
    outside_bytes: int
    before_peak_bytes: int
    after_peak_bytes: int
    optimizer_step_bytes: int = 0
    weights_bytes: int = 0
    optimizer_state_bytes: int = 0
    weight_grad_bytes: int = 0
    optimizer_peak_bytes: int = 0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"step costs: {item.name} must be a whole number of bytes >= 0, found {value!r}")

    @property
    def base_bytes(self) -> int:
        """What stays allocated beside the chain from its first forward to its last backward."""
        return self.model_state_bytes + self.inputs_bytes + self.outside_bytes

    @property
    def floor_bytes(self) -> int:
        """The part of the step no schedule changes: the peaks before and after the chain."""
        return max(self.before_peak_bytes, self.after_peak_bytes)

    def step_peak_bytes(self, chain_peak_bytes: int) -> int:
        """The whole step's peak when the chain's simulated peak is ``chain_peak_bytes``."""
        return max(self.floor_bytes, self.base_bytes + int(chain_peak_bytes))

    def chain_budget_bytes(self, step_budget_bytes: int) -> int:
        """The chain's own budget (the paper's M) inside a whole-step budget (may be negative)."""
        return int(step_budget_bytes) - self.base_bytes

    def explain_base(self) -> str:
        """What ``base_bytes`` is made of, in words (for messages)."""
        return (f"model and optimizer state {format_bytes(self.model_state_bytes)}, batch "
                f"{format_bytes(self.inputs_bytes)}, other activations {format_bytes(self.outside_bytes)}")

    def explain_floor(self) -> str:
        """Which part of the step no schedule can lower, in words."""
        if self.after_peak_bytes < self.before_peak_bytes:
            return (f"the step peaks at {format_bytes(self.floor_bytes)} before the chain (the modules before it), "
                    "which no schedule changes")
        if self.optimizer_peak_bytes >= self.after_peak_bytes:
            return (
                f"the optimizer step needs {format_bytes(self.optimizer_step_bytes)} above the model state "
                f"and gradients it starts from; no schedule can go below {format_bytes(self.floor_bytes)}"
            )
        return (f"the step peaks at {format_bytes(self.floor_bytes)} after the chain (the backward of the modules "
                "before it, beside every parameter gradient), which no schedule changes")

    def to_dict(self) -> dict[str, int]:
        """The JSON-compatible form that :meth:`from_dict` reads."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StepCosts:
        """Reads step costs from a dict (unknown keys are ignored, missing optional ones are 0).

        Raises:
            ChainError: not a mapping, a required key missing, or a value not a whole number >= 0.
        """
        if not isinstance(raw, Mapping):
            raise ChainError(f"step costs must be an object, found {type(raw).__name__}")
        known = {item.name: item for item in fields(cls)}
        required = [name for name, item in known.items() if item.default is MISSING]
        missing = [name for name in required if name not in raw]
        if missing:
            raise ChainError(f"step costs lack {missing}; expected keys {sorted(known)}")
        values = {}
        for name in known:
            if name in raw:
                value = raw[name]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ChainError(f"step costs: {name} must be a whole number of bytes, found {value!r}")
                values[name] = int(math.ceil(value))
        return cls(**values)


def step_infeasible(step: StepCosts, algorithm: str, budget_bytes: int,
                    min_bytes: int | None) -> InfeasibleBudgetError:
    """The error for a whole-step budget below the minimum, saying what dominates it.

    Args:
        step: the step around the chain.
        algorithm: the algorithm asked for.
        budget_bytes: the whole-step budget asked for.
        min_bytes: the whole-step minimum feasible budget (``None``: no budget works).
    """
    budget = int(budget_bytes)
    named = "none: no budget works" if min_bytes is None else f"{format_bytes(min_bytes)} ({min_bytes} bytes)"
    if budget < step.floor_bytes:
        message = (f"budget {format_bytes(budget)} ({budget} bytes) is below what the training step needs outside "
                   f"the chain: {step.explain_floor()}; the smallest budget for {algorithm} is {named}")
    else:
        message = (f"budget {format_bytes(budget)} ({budget} bytes) for the whole step is too small for {algorithm}: "
                   f"the step holds {format_bytes(step.base_bytes)} besides the chain ({step.explain_base()}), "
                   f"leaving the chain "
                   f"{format_bytes(max(budget - step.base_bytes, 0))}; the smallest budget is {named}")
    return InfeasibleBudgetError(message, budget_bytes=budget,
                                 min_feasible_bytes=None if min_bytes is None else int(min_bytes))
