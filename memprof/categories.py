"""Memory categories: one vocabulary for every table, plot and report."""

from __future__ import annotations

from enum import Enum


class Category(str, Enum):
    """What a byte of allocated memory is used for.

    The values are the column names used in every trace table and figure.
    """

    WEIGHTS = "weights"
    BUFFERS = "buffers"
    WEIGHT_GRADS = "weight_grads"
    FEATURE_MAPS = "feature_maps"
    #: Copies of weights that exist only around a module's compute: autocast's low-precision casts saved for
    #: backward, FSDP2's unsharded (all-gathered) parameters.
    WEIGHT_COPIES = "weight_copies"
    GRADS = "grads"
    OPTIMIZER_STATE = "optimizer_state"
    #: Buffers that distributed training keeps for communication: DDP's gradient buckets.
    COMM_BUFFERS = "comm_buffers"
    INPUTS = "inputs"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


#: Categories in display order (model state first, then activations, then the rest).
CATEGORIES: tuple[Category, ...] = tuple(Category)

#: Column names of the categories, in display order.
CATEGORY_COLUMNS: tuple[str, ...] = tuple(c.value for c in CATEGORIES)

#: The allocator's cache (reserved but not allocated); not a category of allocated bytes.
RESERVED = "reserved"

#: Categories that the rematerialization budget does not count (the ROTOR paper's M excludes them). DDP's
#: gradient buckets live as long as the model, whatever a schedule recomputes, so they count as its state.
MODEL_STATE: frozenset[Category] = frozenset(
    {Category.WEIGHTS, Category.BUFFERS, Category.WEIGHT_GRADS, Category.OPTIMIZER_STATE, Category.COMM_BUFFERS}
)
