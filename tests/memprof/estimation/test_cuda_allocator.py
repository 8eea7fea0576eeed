"""The CUDA caching-allocator model: its rules on hand-computed cases, and the model against a slow, obvious
reference on random sequences of allocations and frees."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from memprof.estimation.cuda_allocator import CachingAllocatorModel, round_size, segment_size, should_split

KiB, MiB = 1 << 10, 1 << 20


def test_sizes_round_up_to_512_bytes():
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 512, 1024, 1024, 1536]
    assert round_size(10 * MiB + 1) == 10 * MiB + 512


def test_segment_sizes():
    assert segment_size(512) == segment_size(MiB) == 2 * MiB  # small requests: 2 MiB segments
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB  # 1 to 10 MiB: 20 MiB segments
    assert segment_size(10 * MiB) == 10 * MiB  # from 10 MiB: the request rounded up to 2 MiB
    assert segment_size(10 * MiB + 512) == 12 * MiB


def test_when_blocks_split():
    assert should_split(2 * MiB, 512, small=True)  # 2 MiB - 512 B left: kept
    assert should_split(1024, 512, small=True)  # 512 B left: kept
    assert not should_split(512, 512, small=True)
    assert not should_split(20 * MiB, 19 * MiB, small=False)  # exactly 1 MiB left: not more than 1 MiB
    assert should_split(20 * MiB, 19 * MiB - 512, small=False)


def test_small_requests_share_a_2_mib_segment():
    model = CachingAllocatorModel()
    a, a_size = model.malloc(100)
    b, b_size = model.malloc(1000)
    assert (a_size, b_size) == (512, 1024) and b == a + 512
    assert (model.allocated_bytes, model.reserved_bytes) == (1536, 2 * MiB)


def test_a_freed_block_is_reused_and_merged_with_free_neighbours():
    model = CachingAllocatorModel()
    a, _ = model.malloc(512)
    b, _ = model.malloc(512)
    c, _ = model.malloc(512)
    assert model.free(a) == 512 and model.free(b) == 512
    again, size = model.malloc(1024)  # a and b merged into one 1 KiB block: the best fit
    assert (again, size) == (a, 1024)
    model.free(c)
    model.free(again)
    assert (model.allocated_bytes, model.reserved_bytes) == (0, 2 * MiB)  # segments are never given back
    whole, size = model.malloc(MiB)  # the segment is one free block again: a 1 MiB block at its start
    assert (whole, size) == (a, MiB)


def test_large_requests_and_unsplit_remainders():
    model = CachingAllocatorModel()
    a, a_size = model.malloc(3 * MiB // 2)  # 1.5 MiB: a 20 MiB segment, split (18.5 MiB left)
    assert a_size == 3 * MiB // 2 and model.reserved_bytes == 20 * MiB
    b, b_size = model.malloc(18 * MiB)  # best fit: the 18.5 MiB remainder; 0.5 MiB left is not split off
    assert (b, b_size) == (a + 3 * MiB // 2, 37 * MiB // 2)
    assert (model.allocated_bytes, model.reserved_bytes) == (20 * MiB, 20 * MiB)
    c, c_size = model.malloc(10 * MiB + 1)  # its own 12 MiB segment, split: 2 MiB - 512 B left
    assert c_size == 10 * MiB + 512 and model.reserved_bytes == 32 * MiB
    small, _ = model.malloc(KiB)  # the small pool never uses the large pool's free blocks
    assert model.reserved_bytes == 34 * MiB


# --- the slow, obvious reference: every segment a list of [start, size, allocated] blocks in address order --
@dataclass
class _Reference:
    segments: list[tuple[bool, list[list]]]
    next_address: int = 1 << 40
    allocated_bytes: int = 0
    reserved_bytes: int = 0

    def malloc(self, nbytes: int) -> tuple[int, int]:
        size = max(512, -(-nbytes // 512) * 512)
        small = size <= MiB
        free = [(block[1], block[0], blocks) for pool, blocks in self.segments if pool == small
                for block in blocks if not block[2] and block[1] >= size]
        if free:
            _, start, blocks = min(free, key=lambda f: (f[0], f[1]))
        else:
            reserved = 2 * MiB if small else 20 * MiB if size < 10 * MiB else -(-size // (2 * MiB)) * 2 * MiB
            start, blocks = self.next_address, [[self.next_address, reserved, False]]
            self.segments.append((small, blocks))
            self.next_address += reserved + 2 * MiB
            self.reserved_bytes += reserved
        index = next(i for i, block in enumerate(blocks) if block[0] == start)
        block = blocks[index]
        rest = block[1] - size
        if (rest >= 512) if small else (rest > MiB):
            blocks.insert(index + 1, [start + size, rest, False])
            block[1] = size
        block[2] = True
        self.allocated_bytes += block[1]
        return start, block[1]

    def free(self, address: int) -> int:
        for _, blocks in self.segments:
            for index, block in enumerate(blocks):
                if block[0] == address and block[2]:
                    block[2] = False
                    self.allocated_bytes -= block[1]
                    size = block[1]
                    if index + 1 < len(blocks) and not blocks[index + 1][2]:
                        block[1] += blocks.pop(index + 1)[1]
                    if index > 0 and not blocks[index - 1][2]:
                        blocks[index - 1][1] += blocks.pop(index)[1]
                    return size
        raise KeyError(address)


_SIZES = st.one_of(st.integers(1, 4 * KiB), st.integers(4 * KiB, 2 * MiB), st.integers(2 * MiB, 40 * MiB))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _SIZES, st.integers(0, 1 << 30)), max_size=60))
def test_the_model_agrees_with_the_reference(steps):
    model, reference = CachingAllocatorModel(), _Reference([])
    live: list[int] = []
    for allocate, nbytes, pick in steps:
        if allocate or not live:
            got = model.malloc(nbytes)
            assert got == reference.malloc(nbytes)
            assert got[1] >= round_size(nbytes)
            live.append(got[0])
        else:
            address = live.pop(pick % len(live))
            assert model.free(address) == reference.free(address)
        assert (model.allocated_bytes, model.reserved_bytes) == (reference.allocated_bytes, reference.reserved_bytes)
        assert model.allocated_bytes <= model.reserved_bytes
