"""Slow references for binomial checkpointing: every split tried, every forward counted by replaying.

``advances_brute_force(n, s)`` is revolve's recurrence written plainly, with no closed form: reversing
``n`` steps with ``s`` snapshots (the start state one of them) is either one taped step (``n = 1``) or an
advance of ``m`` steps to a new snapshot, the last ``n - m`` steps reversed with ``s - 1`` snapshots, then
the first ``m`` with ``s`` again. The tests compare it with :func:`binomial_split.advances` and with the
forwards of the schedules :func:`binomial_split.binomial_ops` builds.
"""

from __future__ import annotations

import math
from functools import cache


@cache
def advances_brute_force(steps: int, snapshots: int) -> float:
    """The fewest advancing forwards (taped ones not counted) over every split; inf when impossible."""
    if steps == 1:
        return 0
    if snapshots == 0:
        return math.inf
    return min(
        split + advances_brute_force(split, snapshots) + advances_brute_force(steps - split, snapshots - 1)
        for split in range(1, steps)
    )
