"""Gradient accumulation in a profiled step: the part of its timeline a chain's step costs are read from.

An iteration recorded with k micro-batches (``iterations.micro_batches``, see
:mod:`memprof.analysis.micro_batches`) holds k forward/backward pairs and one optimizer step. Its ``layers``
rows are already one micro-batch's (the last); its ``events`` are the whole step. The chain's step costs
(:mod:`planner.discovery.step_costs`) are read from the last micro-batch: from the first row after the previous one's
backward to the end of the iteration (the optimizer step included). That micro-batch runs with the earlier
ones' parameter gradients held (model state for the chain, as with ``zero_grad(set_to_none=False)``) and its
backward adds to them in place, so its peak is the step's: the first micro-batch holds less and allocates
the gradients it leaves, the ones between equal the last without the optimizer step. A schedule runs in
every micro-batch, which keeps that order.
"""

from __future__ import annotations

import pandas as pd

from memprof.phases import Phase


def last_micro_batch(events: pd.DataFrame, micro_batches: int) -> pd.DataFrame:
    """The rows of one iteration's ``events`` from its last micro-batch on (all of them when not split).

    Args:
        events: one iteration's events.
        micro_batches: the iteration's ``micro_batches``.
    """
    if micro_batches <= 1 or events.empty:
        return events
    rows = events.sort_values("seq")
    roots = rows[(rows.phase == Phase.FORWARD) & (rows.module == "") & (rows.event == "enter")]
    if roots.empty:
        return events
    begins = int(roots.seq.iloc[-1])
    backward = rows[(rows.phase == Phase.BACKWARD) & (rows.seq < begins)]
    # from right after the previous micro-batch's backward: what runs between micro-batches belongs to the next
    after = int(backward.seq.iloc[-1]) if not backward.empty else int(rows.seq.iloc[0]) - 1
    return rows[rows.seq > after]
