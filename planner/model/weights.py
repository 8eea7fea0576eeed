"""What each stage's weights cost, for streaming them from host memory (the seed's weight streaming).

A stage whose weights are *streamed* keeps its parameters, their gradients and its optimizer state in host
memory. The device holds its parameters only around the operations that compute on the stage: they are
copied in (host to device) while the operation before runs, and dropped after the stage's last operation
in a row. ``B(l)`` of a streamed stage writes its parameter gradients on the device; they are copied out
(device to host, added to the host gradients) while the next operation runs, then freed. The optimizer
step of a streamed stage's parameters runs where they live, on the host (PyTorch's optimizers take
parameters on several devices). The rules of when copies run and what the device holds are the
simulator's (:mod:`planner.simulation.weight_streams`); this module only holds the sizes and what streaming takes out
of the step's resident state (:class:`planner.model.step.StepCosts`).

Sizes come from the trace (:func:`weights_from_trace`): each stage's parameters are the sum of its modules'
``weight_bytes`` in ``layers.parquet``, their gradients the same size (a gradient has its parameter's
shape and dtype), and the optimizer state is the step's measured ``optimizer_state_bytes`` shared out in
proportion to the parameters (exact for SGD with momentum and Adam, whose state is per-parameter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from planner.errors import ChainError
from planner.model.step import StepCosts

if TYPE_CHECKING:
    from memprof.trace import Trace


class _WithWeights(Protocol):
    """What :func:`streamed_step` reads of a chain (a Protocol: :mod:`planner.model.chain` imports this module)."""

    @property
    def step(self) -> StepCosts | None: ...

    @property
    def weights(self) -> WeightCosts | None: ...


@dataclass(frozen=True)
class WeightCosts:
    """Per-stage sizes of what weight streaming moves (stages 1..L; index ``l - 1`` is stage ``l``).

    Attributes:
        param_bytes: each stage's parameters (the device holds them while the stage computes).
        grad_bytes: each stage's parameter gradients (written by ``B(l)``, copied to the host after it).
        optimizer_state_bytes: each stage's optimizer state (stays in host memory when streamed).
        grads_in_state: whether the parameter gradients are held from before the step
            (``zero_grad(set_to_none=False)``): then they are part of ``StepCosts.model_state_bytes`` and a
            streamed stage takes them out of it too.
    """

    param_bytes: tuple[int, ...]
    grad_bytes: tuple[int, ...]
    optimizer_state_bytes: tuple[int, ...]
    grads_in_state: bool = False

    def __post_init__(self) -> None:
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            values = tuple(getattr(self, key))
            object.__setattr__(self, key, values)
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ChainError(f"weight costs: {key} must hold whole numbers of bytes >= 0, found {value!r}")
        if not len(self.param_bytes) == len(self.grad_bytes) == len(self.optimizer_state_bytes):
            raise ChainError(
                f"weight costs: param_bytes, grad_bytes and optimizer_state_bytes need one entry per stage; found "
                f"{len(self.param_bytes)}, {len(self.grad_bytes)} and {len(self.optimizer_state_bytes)}"
            )

    @property
    def length(self) -> int:
        """L, the number of stages described."""
        return len(self.param_bytes)

    def params(self, stage: int) -> int:
        """W_l: what the device holds of stage ``stage`` while it computes (0 outside 1..L)."""
        return self.param_bytes[stage - 1] if 1 <= stage <= self.length else 0

    def grads(self, stage: int) -> int:
        """G_l: the gradients ``B(stage)`` writes and the host receives (0 outside 1..L)."""
        return self.grad_bytes[stage - 1] if 1 <= stage <= self.length else 0

    def resident_bytes(self, stage: int) -> int:
        """What streaming stage ``stage`` takes out of the device's model state for the whole step."""
        i = stage - 1
        return self.param_bytes[i] + self.optimizer_state_bytes[i] + (self.grad_bytes[i] if self.grads_in_state else 0)

    def host_bytes(self, streamed: Iterable[int]) -> int:
        """Host memory the streamed stages' parameters, gradients and optimizer state hold."""
        return sum(self.param_bytes[s - 1] + self.grad_bytes[s - 1] + self.optimizer_state_bytes[s - 1]
                   for s in streamed)

    def transient_bound_bytes(self, streamed: Iterable[int], kept_grad_bytes: Sequence[int] = ()) -> int:
        """An upper bound on what streaming adds to the device during any operation.

        The two largest parameter sets (the stage computing, the next one arriving), and twice the largest
        gradient the device would not hold without streaming (one being written, one leaving):
        ``kept_grad_bytes[l - 1]`` is what ``B(l)`` keeps without streaming (``Stage.weight_grad_bytes``),
        which a streamed stage frees, so only gradients above it count.
        """
        stages = list(streamed)
        chosen = sorted((self.params(s) for s in stages), reverse=True)
        kept = list(kept_grad_bytes) + [0] * self.length
        above = max((max(0, self.grads(s) - kept[s - 1]) for s in stages), default=0)
        return sum(chosen[:2]) + 2 * above

    def step_without(self, step: StepCosts, streamed: Iterable[int]) -> StepCosts:
        """``step`` with the streamed stages' resident state in host memory instead of on the device.

        Model state, the peaks before and after the chain (zero_grad and the stem; the stem's backward and the
        optimizer step, which for streamed stages runs on the host) each lose what the stages held there.
        """
        stages = list(streamed)
        resident = sum(self.resident_bytes(s) for s in stages)
        grads = 0 if self.grads_in_state else sum(self.grads(s) for s in stages)  # fresh ones, held after B
        weights = sum(self.params(s) for s in stages)
        state = sum(self.optimizer_state_bytes[s - 1] for s in stages)
        return replace(
            step,
            model_state_bytes=max(step.model_state_bytes - resident, 0),
            before_peak_bytes=max(step.before_peak_bytes - resident, 0),
            after_peak_bytes=max(step.after_peak_bytes - resident - grads, 0),
            weights_bytes=max(step.weights_bytes - weights, 0),
            optimizer_state_bytes=max(step.optimizer_state_bytes - state, 0),
            weight_grad_bytes=max(step.weight_grad_bytes - sum(self.grads(s) for s in stages), 0),
            optimizer_peak_bytes=max(step.optimizer_peak_bytes - resident - grads, 0),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-compatible form :meth:`from_dict` reads."""
        return {"param_bytes": list(self.param_bytes), "grad_bytes": list(self.grad_bytes),
                "optimizer_state_bytes": list(self.optimizer_state_bytes), "grads_in_state": self.grads_in_state}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WeightCosts:
        """Reads weight costs from a dict.

        Raises:
            ChainError: not a mapping, a list missing, or a value out of range.
        """
        if not isinstance(raw, Mapping):
            raise ChainError(f"weight costs must be an object, found {type(raw).__name__}")
        missing = [k for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes") if k not in raw]
        if missing:
            raise ChainError(f"weight costs lack {missing}; expected lists param_bytes, grad_bytes and "
                             "optimizer_state_bytes with one entry per stage 1..L")
        return cls(tuple(raw["param_bytes"]), tuple(raw["grad_bytes"]), tuple(raw["optimizer_state_bytes"]),
                   bool(raw.get("grads_in_state", False)))


def check_streamed(weights: WeightCosts | None, streamed: Iterable[int], length: int) -> frozenset[int]:
    """``streamed`` as a set of stages 1..L.

    Raises:
        ChainError: a stage outside 1..L (the loss is never streamed: the executor does not run it), or a
            streamed set on a chain without weight costs.
    """
    chosen = frozenset(int(s) for s in streamed)
    if not chosen:
        return chosen
    if weights is None:
        raise ChainError("the schedule streams weights but the chain has no weight costs (chain.weights); build "
                         "the chain from a trace or give WeightCosts")
    wrong = sorted(s for s in chosen if not 1 <= s <= min(length, weights.length))
    if wrong:
        raise ChainError(f"streamed stages {wrong} are outside 1..{length}: only the chain's stages (not the loss) "
                         "can stream their weights")
    return chosen


def streamed_step(chain: _WithWeights, streamed: Iterable[int]) -> StepCosts | None:
    """The chain's step costs with ``streamed`` stages' resident state in host memory (``None``: no step)."""
    chosen = list(streamed)
    if chain.step is None or not chosen or chain.weights is None:
        return chain.step
    return chain.weights.step_without(chain.step, chosen)


def weights_from_trace(trace: Trace, modules: Iterable[Iterable[str]], step: StepCosts | None,
                       fresh_grads: bool = True) -> WeightCosts:
    """Per-stage weight costs from a trace's ``layers`` table (the last iteration recorded).

    Args:
        trace: the profiled run.
        modules: for each stage 1..L, the qualified names of the modules it runs.
        step: the step's costs (its ``optimizer_state_bytes`` is shared out by parameter size); ``None``: 0.
        fresh_grads: whether the step allocates the parameter gradients (``zero_grad(set_to_none=True)``).
    """
    layers = trace.read("layers", columns=["iteration", "module", "weight_bytes"])
    last = layers[layers.iteration == layers.iteration.max()].groupby("module").weight_bytes.max()
    params = tuple(int(sum(int(last.get(m, 0)) for m in group)) for group in modules)
    total = sum(params)
    state = step.optimizer_state_bytes if step is not None else 0
    weights_total = step.weights_bytes if step is not None and step.weights_bytes else total
    shares = tuple(int(state * p // weights_total) if weights_total else 0 for p in params)
    return WeightCosts(params, params, shares, grads_in_state=not fresh_grads)
