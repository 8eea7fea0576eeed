"""The immutable memory state between two operations of a schedule (the searches' nodes).

The rules that move from one state to the next are :mod:`planner.simulation.simulator`'s; this module only names
what a state holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class StepError(Exception):
    """Raised by :func:`planner.simulation.simulator.step` with the reason an operation cannot run (without its position)."""


@dataclass(frozen=True)
class MemoryState:
    """What is held in memory between two operations (immutable and hashable, for searches).

    Attributes:
        plain: indices ``l`` for which ``a^l`` is held on its own.
        saved: indices ``l`` for which ``a-bar^l`` (what ``B(l)`` needs, including ``a^l``) is held.
        delta: index ``l`` of the gradient ``delta^l`` currently held (exactly one is held at any time).
        live_bytes: total size of the held values.
        options: ``(l, k)`` for each ``l`` in ``saved`` recorded with recomputation option ``k > 0``
            (:mod:`planner.model.stage_option`): then only a-bar_k^l is held, and ``B(l)`` recomputes the rest.
    """

    plain: frozenset[int]
    saved: frozenset[int]
    delta: int
    live_bytes: int
    options: frozenset[tuple[int, int]] = frozenset()

    def has_a(self, index: int) -> bool:
        """Whether ``a^index`` is available, on its own or inside ``a-bar^index``."""
        return index in self.plain or index in self.saved

    def option_of(self, index: int) -> int:
        """The option ``a-bar^index`` was recorded with (0: everything, or not held)."""
        return dict(self.options).get(index, 0)

    def live_names(self) -> tuple[str, ...]:
        """The held values, e.g. ``("a^0", "abar^3", "delta^4")``, by index."""
        return names(self.plain, self.saved, self.delta)


def names(plain: Iterable[int], saved: Iterable[int], delta: int) -> tuple[str, ...]:
    """The names of held values, sorted by index, the gradient last."""
    named = [(i, f"a^{i}") for i in plain] + [(i, f"abar^{i}") for i in saved]
    return tuple(name for _, name in sorted(named)) + (f"delta^{delta}",)
