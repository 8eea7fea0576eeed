"""A tensor carried across stages (a skip connection, an encoder's output): what ``Chain.carried`` holds.

The memory rule for it is :mod:`planner.solvers.carried_fit`; this module holds only the record, so that
:mod:`planner.model.chain` can import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import ChainError


@dataclass(frozen=True)
class Carried:
    """A tensor read by stages besides their running activation.

    Attributes:
        producer: the stage whose output it is (1..L), or 0 when it was made before the chain.
        consumers: the stages that read it, each after ``producer + 1`` when made by a stage.
        size_bytes: its size.
        name: the module that made it (for messages).
        grad: whether a gradient flows back through it (a tensor made by a module; not a mask).
    """

    producer: int
    consumers: tuple[int, ...]
    size_bytes: int
    name: str = ""
    grad: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumers", tuple(sorted(int(c) for c in self.consumers)))
        if isinstance(self.size_bytes, bool) or not isinstance(self.size_bytes, int) or self.size_bytes < 0:
            raise ChainError(f"carried tensor {self.name!r}: size_bytes must be a whole number >= 0, found "
                             f"{self.size_bytes!r}")
        if not self.consumers or self.producer < 0 or self.consumers[0] <= self.producer:
            raise ChainError(f"carried tensor {self.name!r}: expected consumers after its producer stage "
                             f"{self.producer}, found {list(self.consumers)}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :func:`carried_from_dict` reads."""
        return {"producer": self.producer, "consumers": list(self.consumers), "size_bytes": self.size_bytes,
                "name": self.name, "grad": self.grad}


def carried_from_dict(raw: Mapping[str, Any]) -> Carried:
    """Reads a :class:`Carried` from its JSON form.

    Raises:
        ChainError: not an object, or a key missing or malformed.
    """
    if not isinstance(raw, Mapping) or not {"producer", "consumers", "size_bytes"} <= set(raw):
        raise ChainError(f"a carried tensor is an object with producer, consumers and size_bytes; found {raw!r}")
    try:
        return Carried(int(raw["producer"]), tuple(int(c) for c in raw["consumers"]), raw["size_bytes"],
                       str(raw.get("name", "")), bool(raw.get("grad", True)))
    except (TypeError, ValueError) as exc:
        raise ChainError(f"carried tensor {raw!r}: {exc}") from None


def check_stages(carried: Sequence[Carried], length: int) -> None:
    """Raises ChainError when a carried tensor names a stage outside 1..``length``."""
    for item in carried:
        if item.producer > length or item.consumers[-1] > length:
            raise ChainError(f"carried tensor {item.name!r} names stages {item.producer}..{item.consumers[-1]}; the "
                             f"chain has stages 1..{length}")
