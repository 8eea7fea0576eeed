"""Each stage's recomputation options in memory slots, for the selective persistent DP (``selective.py``).

Row ``k`` holds option ``k`` of every stage (row 0: keep everything, a-bar^l and no recomputation); a stage
with fewer options than the chain's most has rows past its own that never fit (a-bar of ``slots + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.solvers.discretize import DiscreteChain, to_slots


@dataclass(frozen=True, eq=False)
class OptionGrid:
    """The options of a discretised chain, indexed ``[k, l]`` (``l`` in the paper's numbering, 0 unused).

    Attributes:
        abar: int64 ``(K, L+2)``: a-bar_k^l in slots (rounded up); ``slots + 1`` where stage ``l`` has no
            option ``k``.
        recompute_ms: float32 ``(K, L+2)``: what ``B(l)`` recomputes after option ``k`` (0 for ``k = 0``).
        recompute_overhead: int64 ``(K, L+2)``: what that recomputation holds above a-bar^l, in slots
            (rounded up; :meth:`planner.model.chain.Stage.recompute_overhead_with`); 0 for ``k = 0``.
    """

    abar: np.ndarray
    recompute_ms: np.ndarray
    recompute_overhead: np.ndarray

    @classmethod
    def of_grid(cls, grid: DiscreteChain) -> OptionGrid:
        """The options of ``grid.chain`` on ``grid``'s slots."""
        stages = grid.chain.stages
        size = 1 + max(len(stage.options) for stage in stages)
        abar = np.full((size, grid.top + 1), grid.slots + 1, dtype=np.int64)
        recompute = np.zeros((size, grid.top + 1), dtype=np.float32)
        overhead = np.zeros((size, grid.top + 1), dtype=np.int64)
        abar[0] = grid.abar
        for index, stage in enumerate(stages, start=1):
            for k, option in enumerate(stage.options, start=1):
                abar[k, index] = to_slots(option.saved_bytes, grid.slot_bytes)
                recompute[k, index] = option.recompute_ms
                overhead[k, index] = to_slots(stage.recompute_overhead_with(k), grid.slot_bytes)
        return cls(abar, recompute, overhead)

    @property
    def size(self) -> int:
        """K: the most options of any stage, keeping everything included."""
        return int(self.abar.shape[0])
