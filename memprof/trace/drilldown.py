"""The tensors alive at one moment of a detailed iteration, with the op and Python stack that made them.

Joins the ``allocations`` rows of an iteration (every block alive at some events row: its bytes, category,
module, and the rows ``first_seq`` .. ``last_seq`` where it is alive) with the ``stacks`` rows the training
process wrote (the op that returned each new storage, and the Python stack of the large ones): a stacks row
belongs to the block at its address allocated last before the op returned. Traces written before these
optional tables existed give an empty frame.
"""

from __future__ import annotations

import pandas as pd

from memprof.schema import ALLOCATIONS, STACKS
from memprof.trace.reader import Trace

#: Columns of :func:`live_allocations`' frame.
LIVE_COLUMNS: tuple[str, ...] = ("bytes", "category", "module", "phase", "op", "stack", "block")
# the allocator's clock and the one the op's return is stamped with may differ by a few microseconds
_CLOCK_SLACK_NS = 50_000


def allocations_with_ops(trace: Trace, iteration: int) -> pd.DataFrame:
    """Every allocations row of ``iteration`` with its ``op`` and ``stack`` ("" where none was recorded)."""
    blocks = trace.read(ALLOCATIONS, iterations=[iteration])
    blocks = blocks[blocks["iteration"] == iteration].reset_index(drop=True)
    ops = trace.read(STACKS, iterations=[iteration])
    ops = ops[(ops["iteration"] == iteration) & (ops["ptr"] != 0)]
    blocks = blocks.assign(op="", stack="")
    origin = blocks[blocks["alloc_ns"] > 0]
    if ops.empty or origin.empty:
        return blocks
    # for each op output, the latest block allocated at its address before the op returned
    left = ops[["time_ns", "ptr", "op", "stack"]].assign(key=ops["time_ns"] + _CLOCK_SLACK_NS)
    right = origin[["alloc_ns", "ptr", "block"]].rename(columns={"alloc_ns": "key"})
    matched = pd.merge_asof(left.sort_values("key"), right.sort_values("key"), on="key", by="ptr",
                            direction="backward").dropna(subset=["block"])
    first = matched.sort_values("time_ns").drop_duplicates("block")  # the op that made it: the first to return it
    found = first.set_index(first["block"].astype("int64"))
    made = blocks["block"].map(found["op"]).fillna("")
    stacks = blocks["block"].map(found["stack"]).fillna("")
    return blocks.assign(op=made, stack=stacks)


def live_allocations(trace: Trace, iteration: int, seq: int) -> pd.DataFrame:
    """The blocks alive at events row ``seq`` of ``iteration``, largest first (columns :data:`LIVE_COLUMNS`)."""
    frame = allocations_with_ops(trace, iteration)
    alive = frame[(frame["first_seq"] <= seq) & (frame["last_seq"] >= seq)]
    return alive.sort_values(["bytes", "block"], ascending=[False, True])[list(LIVE_COLUMNS)].reset_index(drop=True)
