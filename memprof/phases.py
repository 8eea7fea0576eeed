"""The phases of a training step: one vocabulary for the sweep, the trace and the dashboard."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """Where in a training step an allocator event happened.

    The values are the strings of the events table's ``phase`` column.
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"  # before the first forward, between the steps' parts, after the optimizer

    def __str__(self) -> str:
        return self.value


#: Phases in the trace's order (the events table's dictionary of phase names).
PHASES: tuple[Phase, ...] = tuple(Phase)

#: The analysis' integer code of each phase: the sweep stores one small int per allocator change and
#: turns it into a name only when it writes rows. ``OTHER`` is 0, the state before any mark.
PHASE_CODES: dict[Phase, int] = {Phase.OTHER: 0, Phase.FORWARD: 1, Phase.BACKWARD: 2, Phase.OPTIMIZER: 3}

#: Phase of each code (the inverse of :data:`PHASE_CODES`).
PHASE_OF_CODE: tuple[Phase, ...] = tuple(sorted(PHASE_CODES, key=PHASE_CODES.__getitem__))

#: Phases a chain-only prediction covers (the optimizer step is outside the chain).
CHAIN_PHASES: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD)

#: Phases of a whole training step (its peak may be the optimizer's).
STEP_PHASES: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
