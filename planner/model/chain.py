"""The cost model of a chain (ROTOR paper, Table 1): per-stage times, sizes and overheads.

Stages are numbered 1..L as in the paper; the last entry of ``Chain.stages`` is the loss, stage L+1.
Sizes are bytes, times milliseconds. ``a^0`` (the chain's input) is ``Chain.input_bytes``.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.errors import ChainError, ChainWarning
from planner.model.carried_tensor import Carried, carried_from_dict, check_stages
from planner.model.jsonio import load_json
from planner.model.signature import ModelSignature
from planner.model.stage_option import StageOption, option_from_dict
from planner.model.step import StepCosts
from planner.model.transfer import DEFAULT_TRANSFER, TransferCosts
from planner.model.weights import WeightCosts

_STAGE_INT_FIELDS = (
    "output_bytes",
    "saved_bytes",
    "grad_bytes",
    "forward_overhead_bytes",
    "backward_overhead_bytes",
    "weight_grad_bytes",
)
_STAGE_FLOAT_FIELDS = ("forward_ms", "backward_ms")
SAVED_BYTES_NOISE = 0.05
"""``Chain.from_json`` raises a-bar to a, with a warning, when it is at most this fraction of a below it."""


@dataclass(frozen=True)
class Stage:
    """Costs of one stage of the chain.

    Attributes:
        forward_ms: u_f, time of one forward of the stage.
        backward_ms: u_b, time of its backward.
        output_bytes: a^l, size of the stage's output.
        saved_bytes: a-bar^l, what a recorded forward keeps for backward (includes a^l, not a^{l-1}).
        grad_bytes: delta^l, size of the gradient with respect to the output (usually a^l).
        forward_overhead_bytes: o_f, transient memory above inputs and outputs during forward.
        backward_overhead_bytes: o_b, transient memory above inputs and outputs during backward.
        name: a label, e.g. the module names the stage covers.
        modules: qualified names of the modules the stage runs (empty for a hand-written chain).
        weight_grad_bytes: parameter gradients that ``B(l)`` allocates and that stay allocated until the
            optimizer step (0 when the gradients already exist, e.g. ``zero_grad(set_to_none=False)``).
        existing_grads_overhead_bytes: o_b where every parameter's ``.grad`` already exists (``None``: o_b):
            no parameter gradient stays allocated, ``AccumulateGrad`` adds each into ``.grad`` and frees it, and
            the executor's embeddings add their rows into ``.grad`` instead of a whole-weight gradient
            (:mod:`planner.discovery.existing_grads`); :func:`planner.discovery.loss_options.without_weight_grads`
            uses it.
        options: the stage's recomputation options besides keeping everything (option 0); ``F_all`` with
            option ``k`` keeps ``options[k-1].saved_bytes`` (:mod:`planner.model.stage_option`).
    """

    forward_ms: float
    backward_ms: float
    output_bytes: int
    saved_bytes: int
    grad_bytes: int
    forward_overhead_bytes: int = 0
    backward_overhead_bytes: int = 0
    name: str = ""
    modules: tuple[str, ...] = ()
    weight_grad_bytes: int = 0
    options: tuple[StageOption, ...] = ()
    existing_grads_overhead_bytes: int | None = None

    def __post_init__(self) -> None:
        for key in _STAGE_FLOAT_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ChainError(f"stage {self.name or '?'}: {key} must be a finite number >= 0, found {value!r}")
        for key in _STAGE_INT_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"stage {self.name or '?'}: {key} must be a whole number of bytes >= 0, found {value!r}")
        if self.saved_bytes < self.output_bytes:
            raise ChainError(
                f"stage {self.name or '?'}: saved_bytes (a-bar, {self.saved_bytes}) must include output_bytes "
                f"(a, {self.output_bytes}); expected saved_bytes >= output_bytes"
            )
        value = self.existing_grads_overhead_bytes
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ChainError(f"stage {self.name or '?'}: existing_grads_overhead_bytes must be None or a whole number "
                             f"of bytes >= 0, found {value!r}")
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "options", tuple(self.options))
        for option in self.options:
            if not isinstance(option, StageOption):
                raise ChainError(f"stage {self.name or '?'}: options must be StageOption objects, found {option!r}")
            if not self.output_bytes <= option.saved_bytes <= self.saved_bytes:
                raise ChainError(
                    f"stage {self.name or '?'}: option {option.name!r} keeps {option.saved_bytes} bytes; expected "
                    f"between output_bytes ({self.output_bytes}) and saved_bytes ({self.saved_bytes})"
                )

    def saved_with(self, option: int) -> int:
        """a-bar with option ``option`` (0: keep everything)."""
        return self.saved_bytes if option == 0 else self.options[option - 1].saved_bytes

    def recompute_ms_with(self, option: int) -> float:
        """What ``B(l)`` spends recomputing after a forward with option ``option`` (0: nothing)."""
        return 0.0 if option == 0 else self.options[option - 1].recompute_ms

    def forward_overhead_with(self, option: int) -> int:
        """o_f with option ``option``: the option's own when it has one (a chunked loss), else the stage's."""
        own = self.options[option - 1].forward_overhead_bytes if option else None
        return self.forward_overhead_bytes if own is None else own

    def backward_overhead_with(self, option: int) -> int:
        """o_b with option ``option``: the option's own when it has one (a chunked loss), else the stage's."""
        own = self.options[option - 1].backward_overhead_bytes if option else None
        return self.backward_overhead_bytes if own is None else own

    def recompute_overhead_with(self, option: int) -> int:
        """What ``B(l)``'s recomputation after option ``option`` holds above a-bar^l at its peak: o_f (the
        stage's forward runs again), or the option's own when it has more (a partial replay's temporaries).

        Never less than o_f: then recording with an option never lowers what ``F_all(l)`` followed at once by
        ``B(l)`` needs (its recomputation needs what the plain forward did), which the DPs' base case
        ``C(l, l, m)`` relies on to try no option there."""
        own = self.options[option - 1].recompute_overhead_bytes if option else None
        return self.forward_overhead_bytes if own is None else max(own, self.forward_overhead_bytes)

    def regrown_with(self, option: int) -> int:
        """What ``B(l)`` brings back before its backward after a forward with ``option``: a selective option's
        dropped tensors (a-bar - a-bar_k, recomputed first), nothing for a chunked loss (it recomputes one
        chunk at a time, inside its backward's overhead) or option 0."""
        if option == 0 or self.options[option - 1].chunks:
            return 0
        return self.saved_bytes - self.saved_with(option)


@dataclass(frozen=True)
class Chain:
    """A validated chain of L stages plus the loss.

    Attributes:
        name: a label for the chain (model or container name).
        input_bytes: a^0, size of the chain's input.
        stages: L + 1 stages; the last one is the loss.
        source: where the chain came from (run, modules, why they were chosen).
        step: what the training step holds besides the chain (model state, optimizer, batch, activations
            outside the chain); ``None`` for a hand-written chain. With it, budgets mean the whole step's
            memory (see :mod:`planner.model.step`); without it, the ROTOR paper's M (the chain's memory only).
        transfer: the device's bandwidths to and from host memory and the host cap, for offloading
            (:mod:`planner.model.transfer`); ``None``: :data:`planner.model.transfer.DEFAULT_TRANSFER`.
        carried: tensors stages read besides their running activation (skip connections, an encoder's
            output); their memory is counted by :mod:`planner.solvers.carried_fit`.
        signature: what the chain's model looked like (stage modules, their parameters, the containers
            holding them, the root), so that a schedule refuses another model
            (:mod:`planner.model.signature`); ``None`` for a hand-written chain or one read from older JSON.
    """

    name: str
    input_bytes: int
    stages: tuple[Stage, ...]
    source: dict[str, Any] = field(default_factory=dict, compare=False)
    step: StepCosts | None = None
    transfer: TransferCosts | None = None
    carried: tuple[Carried, ...] = ()
    weights: WeightCosts | None = None
    signature: ModelSignature | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.input_bytes, bool) or not isinstance(self.input_bytes, int) or self.input_bytes < 0:
            raise ChainError(f"input_bytes (a^0) must be a whole number of bytes >= 0, found {self.input_bytes!r}")
        stages = tuple(self.stages)
        if len(stages) < 2:
            raise ChainError(
                f"a chain needs at least one stage plus the loss (2 entries in 'stages'), found {len(stages)}"
            )
        if not all(isinstance(s, Stage) for s in stages):
            raise ChainError("stages must be Stage objects; use Chain.from_json for dicts")
        if self.step is not None and not isinstance(self.step, StepCosts):
            raise ChainError(f"step must be a StepCosts or None, found {type(self.step).__name__}")
        if self.signature is not None and not isinstance(self.signature, ModelSignature):
            raise ChainError(f"signature must be a ModelSignature or None, found {type(self.signature).__name__}")
        if self.transfer is not None and not isinstance(self.transfer, TransferCosts):
            raise ChainError(f"transfer must be a TransferCosts or None, found {type(self.transfer).__name__}")
        if self.weights is not None and (not isinstance(self.weights, WeightCosts)
                                         or self.weights.length != len(stages) - 1):
            raise ChainError(f"weights must be a WeightCosts with one entry per stage 1..{len(stages) - 1}, found "
                             f"{self.weights!r}")
        for index, stage in enumerate(stages[:-1], start=1):
            if any(option.chunks for option in stage.options):
                raise ChainError(f"stage {index} ({stage.name or '?'}) has a chunked-loss option (chunks > 0); only the "
                                 f"loss stage (the last, {len(stages)}) computes the head and loss in chunks")
        loss, results = stages[-1], stages[-2].grad_bytes + stages[-1].weight_grad_bytes
        for option in loss.options:
            if option.eager and option.saved_bytes < loss.output_bytes + results:
                raise ChainError(f"loss option {option.name!r} computes its gradients in the forward, so it keeps them: "
                                 f"saved_bytes ({option.saved_bytes}) must include delta^L and the parameter gradients "
                                 f"({results} bytes) besides output_bytes ({loss.output_bytes})")
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "carried", tuple(self.carried))
        if not all(isinstance(c, Carried) for c in self.carried):
            raise ChainError("carried must hold Carried objects; use Chain.from_json for dicts")
        check_stages(self.carried, len(stages) - 1)

    @property
    def length(self) -> int:
        """L, the number of stages without the loss."""
        return len(self.stages) - 1

    def a(self, index: int) -> int:
        """a^index for 0 <= index <= L+1 (a^0 is the input)."""
        return self.input_bytes if index == 0 else self.stages[index - 1].output_bytes

    def abar(self, index: int) -> int:
        """a-bar^index (a-bar^0 is a^0)."""
        return self.input_bytes if index == 0 else self.stages[index - 1].saved_bytes

    def delta(self, index: int) -> int:
        """delta^index: the gradient with respect to a^index (delta^0 has the size of a^0)."""
        return self.input_bytes if index == 0 else self.stages[index - 1].grad_bytes

    def stage(self, index: int) -> Stage:
        """Stage ``index`` in paper numbering (1..L+1)."""
        if not 1 <= index <= len(self.stages):
            raise IndexError(f"stage {index} does not exist; expected 1..{len(self.stages)}")
        return self.stages[index - 1]

    def activations_only(self) -> Chain:
        """The same chain without its step costs: budgets then count the chain's memory only (paper's M)."""
        return replace(self, step=None)

    def with_step(self, step: StepCosts | None) -> Chain:
        """The same chain with ``step`` as what the training step holds besides it."""
        return replace(self, step=step)

    @property
    def transfer_costs(self) -> TransferCosts:
        """The transfer costs offloading uses: the chain's own, else the documented default."""
        return self.transfer if self.transfer is not None else DEFAULT_TRANSFER

    def with_transfer(self, transfer: TransferCosts | None) -> Chain:
        """The same chain with ``transfer`` as its device's bandwidths and host cap."""
        return replace(self, transfer=transfer)

    def with_weights(self, weights: WeightCosts | None) -> Chain:
        """The same chain with ``weights`` as its stages' parameter, gradient and optimizer-state sizes."""
        return replace(self, weights=weights)

    def offload_bytes(self, index: int) -> int:
        """What ``OFFLOAD(index)`` moves to host memory: a-bar minus a (the output stays, the next input)."""
        return self.abar(index) - self.a(index)

    @property
    def module_names(self) -> tuple[str, ...]:
        """One label per stage 1..L (the loss excluded)."""
        return tuple(s.name or f"stage{i + 1}" for i, s in enumerate(self.stages[:-1]))

    def to_dict(self) -> dict[str, Any]:
        """The chain as the JSON-compatible dict that :meth:`from_json` reads."""
        stages = []
        for stage in self.stages:
            entry = asdict(stage)
            entry["modules"] = list(stage.modules)
            entry["options"] = [option.to_dict() for option in stage.options]
            if not entry["options"]:
                del entry["options"]
            if entry["existing_grads_overhead_bytes"] is None:
                del entry["existing_grads_overhead_bytes"]
            stages.append(entry)
        out: dict[str, Any] = {"name": self.name, "input_bytes": self.input_bytes, "stages": stages}
        if self.source:
            out["source"] = self.source
        if self.step is not None:
            out["step"] = self.step.to_dict()
        if self.transfer is not None:
            out["transfer"] = self.transfer.to_dict()
        if self.carried:
            out["carried"] = [item.to_dict() for item in self.carried]
        if self.weights is not None:
            out["weights"] = self.weights.to_dict()
        if self.signature is not None:
            out["signature"] = self.signature.to_dict()
        return out

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialises the chain; writes it to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def fingerprint(self) -> str:
        """A short hash of the costs, used to refuse a schedule made for another chain."""
        body = json.dumps({"input_bytes": self.input_bytes, "stages": [
            [s.output_bytes, s.saved_bytes, s.grad_bytes, s.forward_overhead_bytes, s.backward_overhead_bytes]
            + ([s.weight_grad_bytes] if s.weight_grad_bytes else [])
            + ([{"existing": s.existing_grads_overhead_bytes}] if s.existing_grads_overhead_bytes is not None else [])
            + ([[o.saved_bytes, o.recompute_ms] for o in s.options] if s.options else [])
            for s in self.stages
        ], **({"carried": [c.to_dict() for c in self.carried]} if self.carried else {})}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, source: str | Path | Mapping[str, Any]) -> Chain:
        """Reads a chain from a JSON file path, a JSON string or a dict.

        Raises:
            ChainError: the content is not a valid chain (with what was wrong).
        """
        data = _load_json(source)
        if not isinstance(data, Mapping):
            raise ChainError(f"a chain is a JSON object with 'input_bytes' and 'stages', found {type(data).__name__}")
        for key in ("input_bytes", "stages"):
            if key not in data:
                raise ChainError(f"chain JSON lacks {key!r}; expected keys 'name', 'input_bytes', 'stages'")
        raw_stages = data["stages"]
        if not isinstance(raw_stages, Sequence) or isinstance(raw_stages, (str, bytes)):
            raise ChainError(f"'stages' must be a list of objects, found {type(raw_stages).__name__}")
        stages = tuple(_stage_from_dict(i + 1, s) for i, s in enumerate(raw_stages))
        return cls(
            name=str(data.get("name", "chain")),
            input_bytes=_as_int("input_bytes", data["input_bytes"], "chain"),
            stages=stages,
            source=dict(data.get("source", {})),
            step=StepCosts.from_dict(data["step"]) if data.get("step") is not None else None,
            transfer=TransferCosts.from_dict(data["transfer"]) if data.get("transfer") is not None else None,
            carried=tuple(carried_from_dict(item) for item in data.get("carried") or ()),
            weights=WeightCosts.from_dict(data["weights"]) if data.get("weights") is not None else None,
            signature=ModelSignature.from_dict(data["signature"]) if data.get("signature") is not None else None,
        )


def _load_json(source: str | Path | Mapping[str, Any]) -> Any:
    return load_json(source, ChainError, "chain", "a JSON file with 'input_bytes' and 'stages'")


def _as_int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ChainError(f"{where}: {key} must be a finite number of bytes, found {value!r}")
    if value < 0:
        raise ChainError(f"{where}: {key} must be >= 0, found {value!r}")
    return int(math.ceil(value))


def _saved_at_least_output(saved: int, output: int, where: str, raw: Mapping[str, Any]) -> int:
    """``saved`` raised to ``output`` with a :class:`ChainWarning` when slightly below it (a-bar contains a).

    Measured a-bar can fall slightly below a by noise, as in the ROTOR paper's Table 2 (stage 4: 10.66 MB
    against 10.68 MB), so such a chain loads as printed, with the correction said.

    Raises:
        ChainError: a-bar is more than ``SAVED_BYTES_NOISE`` of a below it: no noise, the costs are wrong.
    """
    if saved >= output:
        return saved
    name = f" ({raw['name']})" if raw.get("name") else ""
    label = f"{where}{name}"
    if output - saved > SAVED_BYTES_NOISE * output:
        raise ChainError(
            f"{label}: saved_bytes (a-bar, {saved}) must include output_bytes (a, {output}); expected "
            f"saved_bytes >= output_bytes, or at most {SAVED_BYTES_NOISE:.0%} below it (measurement noise)"
        )
    warnings.warn(
        f"{label}: saved_bytes (a-bar, {saved}) is below output_bytes (a, {output}); a-bar contains a, "
        f"so saved_bytes is raised to {output}",
        ChainWarning,
        stacklevel=5,  # the caller of Chain.from_json
    )
    return output


def _stage_from_dict(index: int, raw: Any) -> Stage:
    where = f"stage {index}"
    if not isinstance(raw, Mapping):
        raise ChainError(f"{where} must be an object, found {type(raw).__name__}")
    required = ("forward_ms", "backward_ms", "output_bytes", "saved_bytes")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ChainError(f"{where} lacks {missing}; each stage needs {list(required)}")
    times = {}
    for key in _STAGE_FLOAT_FIELDS:
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ChainError(f"{where}: {key} must be a finite number >= 0, found {value!r}")
        times[key] = float(value)
    output = _as_int("output_bytes", raw["output_bytes"], where)
    return Stage(
        **times,
        output_bytes=output,
        saved_bytes=_saved_at_least_output(_as_int("saved_bytes", raw["saved_bytes"], where), output, where, raw),
        grad_bytes=_as_int("grad_bytes", raw.get("grad_bytes", output), where),
        forward_overhead_bytes=_as_int("forward_overhead_bytes", raw.get("forward_overhead_bytes", 0), where),
        backward_overhead_bytes=_as_int("backward_overhead_bytes", raw.get("backward_overhead_bytes", 0), where),
        name=str(raw.get("name", "")),
        modules=tuple(str(m) for m in raw.get("modules", ())),
        weight_grad_bytes=_as_int("weight_grad_bytes", raw.get("weight_grad_bytes", 0), where),
        options=_options(raw.get("options", ()), where),
        existing_grads_overhead_bytes=(None if raw.get("existing_grads_overhead_bytes") is None else _as_int(
            "existing_grads_overhead_bytes", raw["existing_grads_overhead_bytes"], where)),
    )


def _options(raw: Any, where: str) -> tuple[StageOption, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ChainError(f"{where}: 'options' must be a list of objects, found {type(raw).__name__}")
    return tuple(option_from_dict(item, where) for item in raw)
