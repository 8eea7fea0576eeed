"""A model of PyTorch's CUDA caching allocator: the block each request gets and the memory it reserves.

An estimate on CUDA predicts what ``torch.cuda.memory_allocated`` and ``memory_reserved`` would say. The
allocator (``c10/cuda/CUDACachingAllocator.cpp``, with its default settings) does this with a request of
``n`` bytes:

* it rounds ``n`` up to a multiple of 512 bytes (:func:`round_size`; at least 512);
* requests of at most 1 MiB (rounded) come from the *small* pool, larger ones from the *large* pool;
* it takes the smallest free cached block of that pool that fits (the lowest address among equals);
* finding none, it reserves a new segment with ``cudaMalloc`` (:func:`segment_size`): 2 MiB for a small
  request, 20 MiB for one under 10 MiB, else the request rounded up to a multiple of 2 MiB;
* it splits the block it found when the rest is worth keeping (:func:`should_split`): in the small pool
  when at least 512 bytes remain, in the large pool when more than 1 MiB remains; otherwise the request
  gets the whole block, and ``memory_allocated`` (and the profiler's event) counts the whole block;
* a freed block merges with free neighbours of its segment; segments are never given back (the allocator
  does so only when ``cudaMalloc`` fails, or on ``torch.cuda.empty_cache()``).

Not modelled: several CUDA streams (one stream is assumed), ``PYTORCH_CUDA_ALLOC_CONF`` options
(``expandable_segments``, ``max_split_size_mb``, ``roundup_power2_divisions``, garbage collection), and
memory outside the allocator (the CUDA context, cuBLAS/cuDNN workspaces that bypass it).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK_BYTES = 512  # every block is a multiple of this
SMALL_SIZE_BYTES = 1 << 20  # the largest request served from the small pool
SMALL_SEGMENT_BYTES = 2 << 20  # small requests are packed into segments of this size
MIN_LARGE_ALLOC_BYTES = 10 << 20  # large requests under this share 20 MiB segments
LARGE_SEGMENT_BYTES = 20 << 20
ROUND_LARGE_BYTES = 2 << 20  # larger requests get a segment of their size rounded to this

__all__ = ["CachingAllocatorModel", "round_size", "segment_size", "should_split"]


def round_size(nbytes: int) -> int:
    """The size of the block a request of ``nbytes`` asks for: at least 512, a multiple of 512."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def is_small(rounded_bytes: int) -> bool:
    """Whether a (rounded) request is served from the small pool."""
    return rounded_bytes <= SMALL_SIZE_BYTES


def segment_size(rounded_bytes: int) -> int:
    """The bytes ``cudaMalloc`` reserves when no cached block fits a (rounded) request."""
    if rounded_bytes <= SMALL_SIZE_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def should_split(block_bytes: int, rounded_bytes: int, small: bool) -> bool:
    """Whether a free block of ``block_bytes`` given to a (rounded) request is split, the rest kept free."""
    remaining = block_bytes - rounded_bytes
    return remaining >= MIN_BLOCK_BYTES if small else remaining > SMALL_SIZE_BYTES


@dataclass
class _Block:
    size: int
    segment_start: int
    segment_end: int
    small: bool
    allocated: bool = False


class CachingAllocatorModel:
    """Replays allocations and frees as the caching allocator would, on one device and one stream.

    Addresses are the model's own (segments laid out one after another); callers map their storages to
    them. ``allocated_bytes`` and ``reserved_bytes`` are what ``torch.cuda.memory_allocated`` and
    ``memory_reserved`` would read.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}  # block start -> block, free or allocated
        self._ends: dict[int, int] = {}  # block end -> block start (to find a block's left neighbour)
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # pool (small?) -> sorted (size, start) of free blocks
        self._next_segment = 1 << 40
        self.allocated_bytes = 0
        self.reserved_bytes = 0

    def malloc(self, nbytes: int) -> tuple[int, int]:
        """Serves a request; returns the block's address and size (what the allocator reports)."""
        size = round_size(nbytes)
        small = is_small(size)
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index < len(pool):
            block_size, start = pool.pop(index)
        else:
            start, block_size = self._new_segment(size, small)
        block = self._blocks[start]
        if should_split(block_size, size, small):
            self._place(start + size, block_size - size, block.segment_start, block.segment_end, small, free=True)
            block.size = size
            self._ends[start + size] = start
        block.allocated = True
        self.allocated_bytes += block.size
        return start, block.size

    def free(self, address: int) -> int:
        """Returns a block to its pool, merging it with free neighbours; returns the block's size.

        Raises:
            KeyError: no block is allocated at ``address``.
        """
        block = self._blocks[address]
        if not block.allocated:
            raise KeyError(f"no block is allocated at {address:#x}")
        freed = block.size
        self.allocated_bytes -= freed
        start, size = address, block.size
        after = start + size
        right = self._blocks.get(after) if after < block.segment_end else None
        if right is not None and not right.allocated:
            self._unlist(after, right)
            size += right.size
        left_start = self._ends.get(start) if start > block.segment_start else None
        left = self._blocks.get(left_start) if left_start is not None else None
        if left_start is not None and left is not None and not left.allocated:
            self._unlist(left_start, left)
            start, size = left_start, size + left.size
        self._unlist(address, block)
        self._place(start, size, block.segment_start, block.segment_end, block.small, free=True)
        return freed

    def _new_segment(self, size: int, small: bool) -> tuple[int, int]:
        reserved = segment_size(size)
        start = self._next_segment
        self._next_segment += reserved + ROUND_LARGE_BYTES  # a gap: segments never merge
        self.reserved_bytes += reserved
        self._place(start, reserved, start, start + reserved, small, free=False)
        return start, reserved

    def _place(self, start: int, size: int, segment_start: int, segment_end: int, small: bool,
               free: bool) -> None:
        self._blocks[start] = _Block(size, segment_start, segment_end, small)
        self._ends[start + size] = start
        if free:
            bisect.insort(self._free[small], (size, start))

    def _unlist(self, start: int, block: _Block) -> None:
        """Forgets a block (merged into a neighbour, or about to be placed again)."""
        del self._blocks[start]
        if self._ends.get(start + block.size) == start:
            del self._ends[start + block.size]
        if not block.allocated:
            pool = self._free[block.small]
            pool.pop(bisect.bisect_left(pool, (block.size, start)))
