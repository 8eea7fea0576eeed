"""Recomputation options of one stage: what ``F_all(l)`` may keep short of everything (selective recomputation).

A stage's forward recorded with option ``o`` keeps the outputs of some of its ops (``saves``) and drops the
rest; ``B(l)`` first recomputes what was dropped (``recompute_ms``), which brings the stage's memory back to
a-bar^l, then runs the backward. Option 0, keep everything, is the plain ``F_all`` and is not listed; the
others come from the op records of a planning pass (:mod:`planner.discovery.option_builder`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import ChainError


@dataclass(frozen=True, kw_only=True)
class StageOption:
    """One recomputation option of a stage.

    Attributes:
        name: a short label (``"compute"``, ``"none"`` ...), shown in schedules and the dashboard.
        saved_bytes: a-bar_o, what the forward keeps until ``B(l)`` with this option (includes a^l).
        recompute_ms: forward time ``B(l)`` spends recomputing what the option dropped.
        recompute_flops: the FLOPs of that recomputation (0 when unknown).
        saves: indexes, in the stage's forward op order (0-based), of the ops whose outputs are kept.
        save_ops: the aten overload names of those ops (``"aten.addmm.default"``).
        save_occurrences: for each kept op, how many ops of the same name the stage's forward ran before it:
            the executor's selective policy finds the ops by name and occurrence.
        chunks: > 0 for a chunked loss (the loss stage only, :mod:`planner.discovery.loss_options`): the
            language-model head and its cross-entropy run over 1/``chunks`` of the tokens at a time and keep
            no logits; ``B`` recomputes them chunk by chunk inside its own transient, so it regrows nothing
            before the backward (:meth:`planner.model.chain.Stage.regrown_with`). 0: a selective option.
        eager: a chunked loss that computes its gradients in the forward (no logits recomputed): a-bar_k
            holds the input gradient and the parameter gradients, which ``B`` hands over instead of
            allocating them.
        param_grad_bytes: what of an eager option's ``saved_bytes`` goes where the parameters already have
            their ``.grad`` (budgets on the activations alone,
            :func:`planner.discovery.loss_options.without_weight_grads`): the runtime adds the head's parameter
            gradients into it as it computes them (:mod:`planner.executor.grad_into`) instead of holding them,
            and keeps the head's input instead, to correct them if the backward asks. 0 for other options.
        partial: a selective option whose ``B(l)`` replays only the ops its dropped saved tensors depend on
            (the cone, :mod:`planner.discovery.cone`; :mod:`planner.executor.partial` runs it), not every op
            it does not keep; ``recompute_ms`` and ``recompute_flops`` are the cone's. Not for a chunked loss.
        forward_overhead_bytes: o_f with this option (``None``: the stage's own).
        backward_overhead_bytes: o_b with this option (``None``: the stage's own).
        recompute_overhead_bytes: what ``B(l)``'s recomputation holds at its peak above a-bar^l (the
            temporaries a partial replay makes on its way to the dropped tensors, and the kept outputs no
            backward reads, released once it ends: :mod:`planner.discovery.replay_peak`); ``None``: the
            stage's o_f (a selective option reruns the whole forward). The rules charge at least o_f
            (:meth:`planner.model.chain.Stage.recompute_overhead_with`).
    """

    name: str
    saved_bytes: int
    recompute_ms: float
    recompute_flops: int = 0
    saves: tuple[int, ...] = ()
    save_ops: tuple[str, ...] = ()
    save_occurrences: tuple[int, ...] = ()
    chunks: int = 0
    eager: bool = False
    param_grad_bytes: int = 0
    partial: bool = False
    forward_overhead_bytes: int | None = None
    backward_overhead_bytes: int | None = None
    recompute_overhead_bytes: int | None = None

    def __post_init__(self) -> None:
        where = f"option {self.name or '?'}"
        for key in ("chunks", "param_grad_bytes", "forward_overhead_bytes", "backward_overhead_bytes",
                    "recompute_overhead_bytes"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ChainError(f"{where}: {key} must be a whole number >= 0, found {value!r}")
        if not isinstance(self.eager, bool) or (self.eager and not self.chunks):
            raise ChainError(f"{where}: eager must be true or false, and true only for a chunked loss (chunks > 0); "
                             f"found eager={self.eager!r}, chunks={self.chunks}")
        if self.param_grad_bytes and (not self.eager or self.param_grad_bytes > self.saved_bytes):
            raise ChainError(f"{where}: param_grad_bytes ({self.param_grad_bytes}) is for an eager loss option and "
                             f"part of its saved_bytes ({self.saved_bytes}); found eager={self.eager}")
        if not isinstance(self.partial, bool) or (self.partial and self.chunks):
            raise ChainError(f"{where}: partial must be true or false, and true only for a selective option (chunks=0); "
                             f"found partial={self.partial!r}, chunks={self.chunks}")
        if self.chunks and self.saves:
            raise ChainError(f"{where}: a chunked loss (chunks={self.chunks}) keeps no ops' outputs; found saves "
                             f"{tuple(self.saves)}")
        for key in ("saved_bytes", "recompute_flops"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"{where}: {key} must be a whole number >= 0, found {value!r}")
        ms = self.recompute_ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
            raise ChainError(f"{where}: recompute_ms must be a finite number >= 0, found {ms!r}")
        saves, names = tuple(int(i) for i in self.saves), tuple(str(n) for n in self.save_ops)
        if any(i < 0 for i in saves) or list(saves) != sorted(set(saves)):
            raise ChainError(f"{where}: saves must be distinct op indexes >= 0 in increasing order, found {saves}")
        if names and len(names) != len(saves):
            raise ChainError(f"{where}: save_ops names {len(names)} ops but saves lists {len(saves)}; expected one name per index")
        occurrences = tuple(int(n) for n in self.save_occurrences)
        if occurrences and (len(occurrences) != len(saves) or min(occurrences) < 0):
            raise ChainError(f"{where}: save_occurrences must give one count >= 0 per kept op, found {occurrences}")
        object.__setattr__(self, "save_occurrences", occurrences)
        object.__setattr__(self, "saves", saves)
        object.__setattr__(self, "save_ops", names)
        object.__setattr__(self, "recompute_ms", float(ms))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-compatible form :func:`option_from_dict` reads."""
        return {"name": self.name, "saved_bytes": self.saved_bytes, "recompute_ms": self.recompute_ms,
                "recompute_flops": self.recompute_flops, "saves": list(self.saves), "save_ops": list(self.save_ops),
                "save_occurrences": list(self.save_occurrences),
                **({"chunks": self.chunks} if self.chunks else {}), **({"eager": True} if self.eager else {}),
                **({"param_grad_bytes": self.param_grad_bytes} if self.param_grad_bytes else {}),
                **({"partial": True} if self.partial else {}),
                **{key: getattr(self, key) for key in ("forward_overhead_bytes", "backward_overhead_bytes",
                                                       "recompute_overhead_bytes")
                   if getattr(self, key) is not None}}


def option_from_dict(raw: Any, where: str) -> StageOption:
    """Reads one option of a chain JSON (``where`` names the stage in errors)."""
    if not isinstance(raw, Mapping):
        raise ChainError(f"{where}: each option must be an object, found {type(raw).__name__}")
    missing = [k for k in ("name", "saved_bytes", "recompute_ms") if k not in raw]
    if missing:
        raise ChainError(f"{where}: an option lacks {missing}; each needs 'name', 'saved_bytes', 'recompute_ms'")
    try:
        return StageOption(name=str(raw["name"]), saved_bytes=raw["saved_bytes"], recompute_ms=raw["recompute_ms"],
                           recompute_flops=raw.get("recompute_flops", 0), saves=tuple(raw.get("saves", ())),
                           save_ops=tuple(raw.get("save_ops", ())),
                           save_occurrences=tuple(raw.get("save_occurrences", ())), chunks=raw.get("chunks", 0),
                           eager=raw.get("eager", False),
                           param_grad_bytes=raw.get("param_grad_bytes", 0), partial=raw.get("partial", False),
                           forward_overhead_bytes=raw.get("forward_overhead_bytes"),
                           backward_overhead_bytes=raw.get("backward_overhead_bytes"),
                           recompute_overhead_bytes=raw.get("recompute_overhead_bytes"))
    except (TypeError, ValueError) as exc:
        raise ChainError(f"{where}: option {raw.get('name')!r} is malformed ({exc})") from None
    except ChainError as exc:
        raise ChainError(f"{where}: {exc}") from None
