"""The one vocabulary of operations shared by every solver, the simulator, executor, exporter and dashboard."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from planner.errors import InvalidScheduleError
from planner.model.chain import Chain
from planner.model.jsonio import load_json
from planner.model.schedule_params import ScheduleParams
from planner.model.step import StepCosts
from planner.model.weights import streamed_step

SCHEDULE_FORMAT = "memprof-schedule"
SCHEDULE_VERSION = 1


class OpKind(str, Enum):
    """The four operations of the ROTOR paper (Table 1), and the two transfers of tensor streaming.

    ``OFFLOAD(l)`` starts copying what ``F_all(l)`` recorded, less its output (a-bar^l - a^l), to host
    memory; ``PREFETCH(l)`` starts copying it back before ``B(l)``. Both run on a copy stream beside the
    computation; :mod:`planner.simulation.simulator` states when they end and what they cost.
    """

    F_ALL = "F_all"  # forward, recording everything B needs (a-bar)
    F_CK = "F_ck"  # forward without recording, keeping its input
    F_NONE = "F_none"  # forward without recording, dropping its input
    B = "B"  # backward of one stage
    OFFLOAD = "OFFLOAD"  # device-to-host copy of a-bar^l - a^l
    PREFETCH = "PREFETCH"  # host-to-device copy of it back

    def __str__(self) -> str:
        return self.value

    @property
    def is_transfer(self) -> bool:
        """Whether this is a copy between device and host (no computation)."""
        return self in (OpKind.OFFLOAD, OpKind.PREFETCH)

    @property
    def is_forward(self) -> bool:
        """Whether this is one of the three forwards."""
        return self in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE)


@dataclass(frozen=True)
class Op:
    """One operation on stage ``stage`` (1..L+1, the loss being L+1).

    ``option`` (``F_all`` only) picks the stage's recomputation option (:mod:`planner.model.stage_option`): 0 keeps
    everything B needs; ``k`` keeps ``chain.stage(stage).options[k-1]`` and ``B`` recomputes the rest.
    """

    kind: OpKind
    stage: int
    option: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OpKind(self.kind))
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 1:
            raise InvalidScheduleError(f"operation stage must be an integer >= 1, found {self.stage!r}")
        if isinstance(self.option, bool) or not isinstance(self.option, int) or self.option < 0:
            raise InvalidScheduleError(f"operation option must be an integer >= 0, found {self.option!r}")
        if self.option and self.kind is not OpKind.F_ALL:
            raise InvalidScheduleError(f"only F_all takes a recomputation option, found {self.kind.value} with option {self.option}")

    def __str__(self) -> str:
        return f"{self.kind.value}({self.stage})" + (f"[{self.option}]" if self.option else "")

    def to_list(self) -> list[Any]:
        """The JSON form: ``[kind, stage]``, or ``[kind, stage, option]`` with an option."""
        return [self.kind.value, self.stage] + ([self.option] if self.option else [])


@dataclass(frozen=True)
class Schedule:
    """A sequence of operations for one chain, with how it was made and what it is predicted to cost.

    Attributes:
        algorithm: the solver that produced it (``"rotor"``, ``"periodic"`` ...).
        budget_bytes: the memory budget it was solved for (``None`` when unconstrained).
        ops: the operations, in order.
        chain: the chain it was made for.
        predicted_peak_bytes: the simulator's peak, when known.
        predicted_makespan_ms: the simulator's makespan, when known.
        params: how the algorithm made it (:class:`ScheduleParams`; a mapping of the same keys is read
            into one).
        predicted_step_peak_bytes: the predicted peak of the whole training step (chains built from a
            trace, which carry :class:`planner.model.step.StepCosts`); ``None`` otherwise.
        predicted_host_peak_bytes: the simulator's peak of host memory held by offloaded activations
            (``None`` when not predicted; 0 for a schedule without transfers).
    """

    algorithm: str
    budget_bytes: int | None
    ops: tuple[Op, ...]
    chain: Chain
    predicted_peak_bytes: int | None = None
    predicted_makespan_ms: float | None = None
    params: ScheduleParams = field(default_factory=ScheduleParams)
    predicted_step_peak_bytes: int | None = None
    predicted_host_peak_bytes: int | None = None

    def __post_init__(self) -> None:
        ops = tuple(o if isinstance(o, Op) else Op(OpKind(o[0]), *(int(v) for v in o[1:])) for o in self.ops)
        top = self.chain.length + 1
        for position, op in enumerate(ops):
            if op.stage > top:
                raise InvalidScheduleError(
                    f"operation {position} ({op}) names stage {op.stage}, but the chain has stages 1..{top}"
                )
            if op.option > len(self.chain.stage(op.stage).options):
                raise InvalidScheduleError(
                    f"operation {position} ({op}) picks option {op.option}, but stage {op.stage} has "
                    f"{len(self.chain.stage(op.stage).options)} recomputation options besides keeping everything"
                )
        object.__setattr__(self, "ops", ops)
        object.__setattr__(self, "params", ScheduleParams.from_dict(self.params))

    @property
    def modules(self) -> tuple[str, ...]:
        """The chain's stage labels (loss excluded)."""
        return self.chain.module_names

    @property
    def streamed_weights(self) -> tuple[int, ...]:
        """The stages whose weights the schedule streams from host memory (``params.streamed_weights``)."""
        return self.params.streamed_weights or ()

    @property
    def has_transfers(self) -> bool:
        """Whether the schedule offloads anything to host memory (activations or streamed weights)."""
        return bool(self.streamed_weights) or any(op.kind.is_transfer for op in self.ops)

    @property
    def step(self) -> StepCosts | None:
        """The step around the chain as this schedule runs it: the streamed stages' resident state in host
        memory (``None``: the chain has no step costs)."""
        return streamed_step(self.chain, self.streamed_weights)

    def with_prediction(self, peak_bytes: int, makespan_ms: float, host_peak_bytes: int | None = None) -> Schedule:
        """Returns a copy carrying the simulator's prediction (the host peak kept unless given)."""
        step = self.step
        step_peak = step.step_peak_bytes(int(peak_bytes)) if step is not None else None
        host = self.predicted_host_peak_bytes if host_peak_bytes is None else int(host_peak_bytes)
        return Schedule(self.algorithm, self.budget_bytes, self.ops, self.chain, int(peak_bytes),
                        float(makespan_ms), self.params, step_peak, host)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-compatible form read by :meth:`from_json`."""
        return {
            "format": SCHEDULE_FORMAT,
            "version": SCHEDULE_VERSION,
            "algorithm": self.algorithm,
            "budget_bytes": self.budget_bytes,
            "modules": list(self.modules),
            "chain_fingerprint": self.chain.fingerprint(),
            "ops": [op.to_list() for op in self.ops],
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_makespan_ms": self.predicted_makespan_ms,
            "predicted_step_peak_bytes": self.predicted_step_peak_bytes,
            "predicted_host_peak_bytes": self.predicted_host_peak_bytes,
            "params": self.params.to_dict(),
            "chain": self.chain.to_dict(),
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialises the schedule; writes it to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, source: str | Path | Mapping[str, Any]) -> Schedule:
        """Reads a schedule from a path, a JSON string or a dict.

        Raises:
            InvalidScheduleError: the content is not a memprof schedule or is malformed.
        """
        data = _load(source)
        if not isinstance(data, Mapping) or data.get("format") != SCHEDULE_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise InvalidScheduleError(f"not a memprof schedule: expected format {SCHEDULE_FORMAT!r}, found {found!r}")
        if data.get("version") != SCHEDULE_VERSION:
            raise InvalidScheduleError(
                f"schedule version {data.get('version')!r} is not supported; expected {SCHEDULE_VERSION}"
            )
        for key in ("algorithm", "ops", "chain"):
            if key not in data:
                raise InvalidScheduleError(f"schedule lacks {key!r}")
        chain = Chain.from_json(data["chain"])
        ops = _parse_ops(data["ops"])
        budget = data.get("budget_bytes")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise InvalidScheduleError(f"budget_bytes must be a whole number >= 0 or null, found {budget!r}")
        peak = data.get("predicted_peak_bytes")
        makespan = data.get("predicted_makespan_ms")
        if makespan is not None and (not isinstance(makespan, (int, float)) or not math.isfinite(makespan)):
            raise InvalidScheduleError(f"predicted_makespan_ms must be a finite number, found {makespan!r}")
        return cls(
            algorithm=str(data["algorithm"]),
            budget_bytes=budget,
            ops=ops,
            chain=chain,
            predicted_peak_bytes=int(peak) if isinstance(peak, (int, float)) else None,
            predicted_makespan_ms=float(makespan) if makespan is not None else None,
            params=ScheduleParams.from_dict(data.get("params")),
            predicted_step_peak_bytes=_optional_bytes(data.get("predicted_step_peak_bytes")),
            predicted_host_peak_bytes=_optional_bytes(data.get("predicted_host_peak_bytes"), "predicted_host_peak_bytes"),
        )


def _optional_bytes(value: Any, key: str = "predicted_step_peak_bytes") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidScheduleError(f"{key} must be a whole number >= 0 or null, found {value!r}")
    return int(value)


def _load(source: str | Path | Mapping[str, Any]) -> Any:
    return load_json(source, InvalidScheduleError, "schedule", "a schedule JSON written by memprof plan")


def _parse_ops(raw: Any) -> tuple[Op, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise InvalidScheduleError(f"'ops' must be a list of [kind, stage(, option)] lists, found {type(raw).__name__}")
    ops = []
    kinds = [k.value for k in OpKind]
    for position, item in enumerate(raw):
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) not in (2, 3):
            raise InvalidScheduleError(f"operation {position} must be [kind, stage] or [kind, stage, option], found {item!r}")
        kind, stage, *option = item
        if kind not in kinds:
            raise InvalidScheduleError(f"operation {position} has kind {kind!r}; expected one of {kinds}")
        if isinstance(stage, bool) or not isinstance(stage, int):
            raise InvalidScheduleError(f"operation {position} has stage {stage!r}; expected an integer")
        if option and (isinstance(option[0], bool) or not isinstance(option[0], int)):
            raise InvalidScheduleError(f"operation {position} has option {option[0]!r}; expected an integer")
        ops.append(Op(OpKind(kind), stage, *option))
    return tuple(ops)
