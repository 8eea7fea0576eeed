"""Memory discretised into slots for the dynamic programs (ROTOR paper, section 5.2).

A slot is a whole number of bytes, at least 1: ``slots`` slots span a reference budget. ``solve`` uses
the budget itself (capped at store-all's simulated peak), the paper's M/S (see
``solvers/budget_grid.py``); the Pareto front uses store-all's peak, the default, so that one DP table
serves every budget. Sizes and overheads are rounded *up* to whole slots and budgets *down*, so a
schedule that fits in slots never exceeds its budget in bytes. A reference of at most ``slots`` bytes
gets 1-byte slots and is solved exactly.

When every size of the chain is a multiple of a number at least the slot (a uniform chain of 1,000-byte
activations), the slot grows to the smallest divisor of that number that is at least the slot
(:func:`aligned_slot_bytes`): no size is rounded and every peak is a whole number of slots, so that grid is
exact too. Without it, 500 slots over 9,000 B are 18 B, a 1,000-byte activation 1,008 B, and nine no longer
fit where the simulator (and binomial's schedule) holds them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.model.chain import Chain
from planner.simulation.baseline import store_all_peak_bytes

DEFAULT_SLOTS = 500


def slot_bytes_for(reference_bytes: int, slots: int) -> int:
    """The slot size that spreads ``slots`` slots over ``reference_bytes`` (rounded up, at least 1)."""
    check_slots(slots)
    return max(1, -(-int(reference_bytes) // slots))


def check_slots(slots: int) -> None:
    """Raises ``ValueError`` unless ``slots`` is a whole number >= 1."""
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise ValueError(f"slots must be a whole number >= 1, found {slots!r}")


@dataclass(frozen=True, eq=False)
class DiscreteChain:
    """A chain's sizes in slots and times in ms, as arrays indexed by the paper's stage numbers.

    Index 0 of ``a``/``abar``/``delta`` is the input ``a^0``; index ``l`` (1..L+1) is stage ``l``.
    ``forward_overhead``, ``backward_overhead``, ``forward_ms`` and ``backward_ms`` have a meaningless 0
    at index 0 so that stage ``l`` is at index ``l`` everywhere.

    Attributes:
        chain: the chain in bytes.
        slot_bytes: the size of one slot.
        slots: the table width; budgets 0..``slots`` slots are represented.
        a, abar, delta, forward_overhead, backward_overhead: sizes in slots (int64, rounded up). ``delta``
            and ``backward_overhead`` include the parameter gradients held beside each gradient (see
            :func:`_weight_grads_after`), so ``backward_overhead`` may be negative.
        forward_ms, backward_ms: u_f and u_b (float64).
    """

    chain: Chain
    slot_bytes: int
    slots: int
    a: np.ndarray
    abar: np.ndarray
    delta: np.ndarray
    forward_overhead: np.ndarray
    backward_overhead: np.ndarray
    forward_ms: np.ndarray
    backward_ms: np.ndarray

    @property
    def top(self) -> int:
        """L + 1, the loss stage."""
        return self.chain.length + 1

    def budget_slots(self, budget_bytes: int) -> int:
        """Whole slots inside ``budget_bytes`` (rounded down; may exceed ``slots``)."""
        return int(budget_bytes) // self.slot_bytes

    def to_bytes(self, slot_count: int) -> int:
        """The budget in bytes of ``slot_count`` whole slots."""
        return int(slot_count) * self.slot_bytes


def to_slots(size_bytes: int, slot_bytes: int) -> int:
    """``size_bytes`` rounded up to whole slots."""
    return -(-int(size_bytes) // slot_bytes)


def discretize(chain: Chain, slots: int = DEFAULT_SLOTS, reference_bytes: int | None = None) -> DiscreteChain:
    """Rounds a chain's sizes up to slots of ``ceil(reference_bytes / slots)`` bytes.

    Args:
        chain: the chain.
        slots: how many slots span the reference budget.
        reference_bytes: the budget the grid is built for; store-all's simulated peak when ``None``.

    Raises:
        ValueError: ``slots`` is not a whole number >= 1.
    """
    check_slots(slots)
    if reference_bytes is None:
        reference_bytes = store_all_peak_bytes(chain)
    top = chain.length + 1
    index = range(top + 1)
    stages = chain.stages
    grads_after = _weight_grads_after(chain)
    raw = {  # the sizes the DPs read, in bytes
        "a": [chain.a(i) for i in index],
        "abar": [chain.abar(i) for i in index],
        "delta": [chain.delta(i) + grads_after[i] for i in index],
        "forward_overhead": [0] + [s.forward_overhead_bytes for s in stages],
        "backward_overhead": [0] + [s.backward_overhead_bytes - grads_after[i + 1] for i, s in enumerate(stages)],
    }
    slot = aligned_slot_bytes([v for values in raw.values() for v in values], slot_bytes_for(reference_bytes, slots))
    return DiscreteChain(
        chain=chain,
        slot_bytes=slot,
        slots=int(slots),
        **{name: np.array([to_slots(v, slot) for v in values], dtype=np.int64) for name, values in raw.items()},
        forward_ms=np.array([0.0] + [s.forward_ms for s in stages], dtype=np.float64),
        backward_ms=np.array([0.0] + [s.backward_ms for s in stages], dtype=np.float64),
    )


def aligned_slot_bytes(sizes_bytes: Iterable[int], slot_bytes: int) -> int:
    """``slot_bytes``, or the smallest divisor at least as large of every one of ``sizes_bytes``, when there is one."""
    common = math.gcd(*(int(v) for v in sizes_bytes))
    return _divisor_at_least(common, int(slot_bytes)) if common >= slot_bytes > 1 else int(slot_bytes)


@lru_cache(maxsize=256)
def _divisor_at_least(number: int, low: int) -> int:
    """The smallest divisor of ``number`` that is at least ``low`` (``number`` itself at worst)."""
    divisors = {d for i in range(1, math.isqrt(number) + 1) if number % i == 0 for d in (i, number // i)}
    return min(d for d in divisors if d >= low)


def _weight_grads_after(chain: Chain) -> list[int]:
    """``W[l]``: the parameter gradients of stages ``l+1 .. L+1``, for ``l`` in 0..L+1.

    The simulator's ``B(l)`` adds ``weight_grad_bytes`` that stay to the end. Exactly one ``delta`` is held
    at any time, and while ``delta^l`` is held the gradients of stages above ``l`` are exactly the ones
    computed so far, so the DPs see them as part of it: ``delta'^l = delta^l + W[l]``. During ``B(l)`` both
    ``delta'^l`` and ``delta'^{l-1}`` are counted, ``W[l]`` twice, so ``o_b`` is lowered by ``W[l]``
    (it may go below 0; the memory during ``B(l)`` stays at or above the memory after it). Each term is
    rounded up, so the DPs never under-count.
    """
    after = [0] * (chain.length + 2)
    for index in range(chain.length, -1, -1):
        after[index] = after[index + 1] + chain.stages[index].weight_grad_bytes
    return after
