"""What a solver records about how it made a schedule: typed, validated, and the same keys in JSON.

Each algorithm fills the fields that describe it (a DP its grid, binomial its snapshots, held its options,
offload what it moved, a fallback where it came from); the others stay ``None`` and are left out of
the JSON form. The schedule file's ``"params"`` object is :meth:`ScheduleParams.to_dict`; reading one
back rejects a key no algorithm writes.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import InvalidScheduleError

__all__ = ["ScheduleParams"]

_INTS = ("slots", "slot_bytes", "segments", "segment_size", "segment_length", "snapshots", "forwards",
         "bound_bytes", "held_budget_bytes", "held_bytes", "table_bytes_estimate", "max_table_bytes")
_STRINGS = ("search", "transfer", "fallback_from")
_STAGE_LISTS = ("options", "offloaded", "streamed_weights")


@dataclass(frozen=True, kw_only=True)
class ScheduleParams:
    """The parameters that produced a schedule (all optional; each algorithm sets its own).

    Attributes:
        slots: the DP's number of memory slots (rotor, rotor_optimal, selective, offload, held).
        slot_bytes: the bytes of one slot of that grid.
        segments: the number of segments (periodic, sqrt).
        segment_size: the stages per segment (periodic).
        segment_length: the stages per segment (sqrt).
        snapshots: binomial's checkpoints (``None`` when it stored everything).
        forwards: binomial's forward operations in all.
        bound_bytes: the memory binomial's snapshots need.
        store_all: whether binomial fell back to storing everything.
        search: how an exact schedule was found (``"exhaustive"``).
        held_budget_bytes: the held bound asked of ``solve_held``.
        held_bytes: what the chosen options keep through the forward.
        options: the option chosen per stage (0 keeps everything), held's answer.
        offloaded: the stages whose activations go to host memory.
        transfer: where the link's costs came from (``"measured"``, ``"default"``...).
        fallback_from: the algorithm asked for, when another one answered.
        table_bytes_estimate: the DP table's estimated bytes that made it hand over.
        max_table_bytes: the limit it was over.
        streamed_weights: the stages whose weights stream from host memory.
    """

    slots: int | None = None
    slot_bytes: int | None = None
    segments: int | None = None
    segment_size: int | None = None
    segment_length: int | None = None
    snapshots: int | None = None
    forwards: int | None = None
    bound_bytes: int | None = None
    store_all: bool | None = None
    search: str | None = None
    held_budget_bytes: int | None = None
    held_bytes: int | None = None
    options: tuple[int, ...] | None = None
    offloaded: tuple[int, ...] | None = None
    transfer: str | None = None
    fallback_from: str | None = None
    table_bytes_estimate: int | None = None
    max_table_bytes: int | None = None
    streamed_weights: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in _INTS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidScheduleError(f"schedule parameter {name!r} must be a whole number >= 0, found {value!r}")
        for name in _STRINGS:
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise InvalidScheduleError(f"schedule parameter {name!r} must be a string, found {getattr(self, name)!r}")
        if self.store_all is not None and not isinstance(self.store_all, bool):
            raise InvalidScheduleError(f"schedule parameter 'store_all' must be true or false, found {self.store_all!r}")
        for name in _STAGE_LISTS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise InvalidScheduleError(f"schedule parameter {name!r} must be a list of whole numbers, found {value!r}")
            items = tuple(value)
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items):
                raise InvalidScheduleError(f"schedule parameter {name!r} must be a list of whole numbers, found {value!r}")
            object.__setattr__(self, name, items)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | ScheduleParams | None) -> ScheduleParams:
        """Reads the JSON form (``None`` and ``{}`` give no parameters).

        Raises:
            InvalidScheduleError: a key no algorithm writes, or a value of the wrong type.
        """
        if isinstance(data, ScheduleParams):
            return data
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidScheduleError(f"schedule 'params' must be an object, found {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidScheduleError(
                f"unknown schedule parameter(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(sorted(known))}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-compatible form: the fields that are set, stage lists as lists."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def replace(self, **changes: Any) -> ScheduleParams:
        """A copy with ``changes`` applied (validated like a new one)."""
        return dataclasses.replace(self, **changes)

    def __getitem__(self, key: str) -> Any:
        """Deprecated: the dict-style read of the old ``Schedule.params`` (use the attribute)."""
        warnings.warn(f"schedule.params[{key!r}] is deprecated; read schedule.params.{key}", DeprecationWarning,
                      stacklevel=2)
        value = getattr(self, key) if key in {f.name for f in dataclasses.fields(self)} else None
        if value is None:
            raise KeyError(key)
        return list(value) if isinstance(value, tuple) else value

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: the dict-style read of the old ``Schedule.params`` (use the attribute)."""
        warnings.warn(f"schedule.params.get({key!r}) is deprecated; read schedule.params.{key}", DeprecationWarning,
                      stacklevel=2)
        value = getattr(self, key, None)
        return default if value is None else (list(value) if isinstance(value, tuple) else value)
