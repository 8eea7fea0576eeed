"""Slow, obviously-correct held-budget search, used by the tests to check ``held.py``.

Tries every combination of options of stages 1..L in exact bytes and keeps the one that recomputes least
while holding at most the budget (ties: the one holding less).
"""

from __future__ import annotations

import itertools

from planner.model.chain import Chain
from planner.solvers.held import stage_choices

MAX_COMBINATIONS = 200_000


def search(chain: Chain, held_budget_bytes: int) -> tuple[float, tuple[int, ...]] | None:
    """``(recompute_ms, options)`` of the best choice within the budget, ``None`` when none fits.

    Raises:
        ValueError: more than :data:`MAX_COMBINATIONS` combinations to try.
    """
    choices = stage_choices(chain)
    count = 1
    for stage in choices:
        count *= len(stage)
    if count > MAX_COMBINATIONS:
        raise ValueError(f"{count} combinations of options; the reference tries at most {MAX_COMBINATIONS}")
    best: tuple[float, int, tuple[int, ...]] | None = None
    for options in itertools.product(*(range(len(stage)) for stage in choices)):
        kept = sum(choices[s][k][0] for s, k in enumerate(options))
        if kept > held_budget_bytes:
            continue
        candidate = (sum(choices[s][k][1] for s, k in enumerate(options)), kept, options)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    return None if best is None else (best[0], best[2])
