"""Store-all, PyTorch's default (every stage recorded once, nothing recomputed): the baseline every schedule
is held against, and the budget above which no algorithm changes anything.

Here rather than in :mod:`planner.solvers.store_all` (which plans with it) so that what the solvers import, the
discretisation among it, can read store-all's peak without importing the solvers.
"""

from __future__ import annotations

from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.simulation.simulator import predict

__all__ = ["store_all_ops", "store_all_peak_bytes"]


def store_all_ops(chain: Chain) -> tuple[Op, ...]:
    """``F_all(1) .. F_all(L+1)`` then ``B(L+1) .. B(1)``."""
    top = chain.length + 1
    return (*(Op(OpKind.F_ALL, stage) for stage in range(1, top + 1)),
            *(Op(OpKind.B, stage) for stage in range(top, 0, -1)))


def store_all_peak_bytes(chain: Chain) -> int:
    """Store-all's simulated peak: the largest budget any algorithm needs."""
    return predict(chain, store_all_ops(chain))[0]
