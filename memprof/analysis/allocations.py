"""One row per allocation of a detailed iteration: what the dashboard lists when a moment of the timeline is clicked.

Every block the sweep followed (:mod:`memprof.analysis.attribution`) that is alive at one row of the events
table or more becomes a row: its bytes, category, the module and phase it was allocated in, and the range of
events rows (``first_seq`` .. ``last_seq``) at which it is alive. The block's address and allocation time
(``ptr``, ``alloc_ns``) let the reader join it with the op and Python stack that the training process
recorded for it (the ``stacks`` table, :mod:`memprof.capture.stacks`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from memprof.analysis.attribution import PHASE_NAMES, Sweep
from memprof.analysis.records import AllocationEvents
from memprof.categories import CATEGORIES
from memprof.schema import ALLOCATIONS_SCHEMA


def row_states(sw: Sweep, changes: int) -> np.ndarray:
    """The state (changes applied) that each events row shows: its ``start`` row, one per mark, its ``end`` row."""
    return np.asarray([0, *(m[3] for m in sw.marks), changes], dtype=np.int64)


def _block_origins(sw: Sweep, events: AllocationEvents) -> tuple[np.ndarray, np.ndarray]:
    """Address and time of each block's allocation event (0 for blocks alive before the iteration).

    The sweep creates a block for every allocation event, in time order (ties in event order), and for
    nothing else once the iteration runs; so the k-th block allocated in the iteration is the k-th
    allocation event. Checked on the sizes: should they disagree, no block gets an origin (never a wrong one).
    """
    count = len(sw.sizes)
    ptrs, times = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    allocated = np.flatnonzero(np.asarray(sw.alloc_change, dtype=np.int64) >= 0)
    size = events.size_bytes
    order = np.lexsort((np.arange(len(size)), events.time_ns))
    positive = order[size[order] > 0]
    if len(positive) != len(allocated) or not np.array_equal(size[positive], np.asarray(sw.sizes)[allocated]):
        return ptrs, times
    ptrs[allocated], times[allocated] = events.ptr[positive], events.time_ns[positive]
    return ptrs, times


def allocation_table(sw: Sweep, events: AllocationEvents, iteration: int, module_names: Sequence[str]) -> pa.Table:
    """The rows of the ``allocations`` table for one detailed iteration (see the module docstring)."""
    changes = len(sw.change_block)
    states = row_states(sw, changes)
    alloc = np.asarray(sw.alloc_change, dtype=np.int64)
    free = np.asarray(sw.free_change, dtype=np.int64)
    # alive at state k: allocated by change c < k (or before the iteration), not freed by a change c' < k
    born = np.where(alloc < 0, 0, alloc + 1)
    dies = np.where(free < 0, changes + 1, free + 1)
    first = np.searchsorted(states, born, side="left")
    last = np.searchsorted(states, dies, side="left") - 1
    keep = np.flatnonzero(first <= last)
    ptrs, times = _block_origins(sw, events)
    c_module = np.asarray(sw.change_module, dtype=np.int64)
    c_phase = np.asarray(sw.change_phase, dtype=np.int64)
    at = alloc[keep]
    module_index = np.where(at >= 0, c_module[np.maximum(at, 0)] if changes else -1, -1)
    phase_code = np.where(at >= 0, c_phase[np.maximum(at, 0)] if changes else 0, 0)
    categories = np.asarray(sw.categories, dtype=np.int64)[keep]
    columns = {
        "iteration": np.full(len(keep), iteration, dtype=np.int64),
        "block": np.asarray(sw.block_ids, dtype=np.int64)[keep],
        "bytes": np.asarray(sw.sizes, dtype=np.int64)[keep],
        "category": [CATEGORIES[c].value for c in categories.tolist()],
        "module": [module_names[m] if m >= 0 else "" for m in module_index.tolist()],
        "phase": [PHASE_NAMES[p].value if at_i >= 0 else "before" for p, at_i in zip(phase_code.tolist(), at.tolist())],
        "first_seq": first[keep].astype(np.int64),
        "last_seq": last[keep].astype(np.int64),
        "ptr": ptrs[keep],
        "alloc_ns": times[keep],
    }
    return pa.Table.from_pydict(columns, schema=ALLOCATIONS_SCHEMA)
