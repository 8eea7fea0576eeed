"""Discretisation: whole-byte slots, sizes rounded up, budgets rounded down."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.model.chain import Chain, Stage
from planner.solvers.discretize import discretize, slot_bytes_for, to_slots
from planner.solvers.store_all import store_all_peak_bytes
from tests.planner.chain_strategies import small_chains, toy_chain


@pytest.mark.parametrize(("reference", "slots", "expected"), [
    (1000, 500, 2), (1001, 500, 3), (500, 500, 1), (7, 500, 1), (0, 500, 1), (10**9, 3, 333333334),
])
def test_slot_size_is_a_whole_number_of_bytes(reference: int, slots: int, expected: int) -> None:
    assert slot_bytes_for(reference, slots) == expected


@pytest.mark.parametrize("slots", [0, -3, 2.5, True, "500"])
def test_bad_slot_counts_are_refused(slots: object) -> None:
    with pytest.raises(ValueError, match="slots must be a whole number >= 1"):
        slot_bytes_for(100, slots)  # type: ignore[arg-type]


@given(st.integers(0, 10**12), st.integers(1, 10**9))
@settings(max_examples=200, deadline=None)
def test_rounding_up_never_undercounts(size: int, slot: int) -> None:
    slots = to_slots(size, slot)
    assert slots * slot >= size
    assert (slots - 1) * slot < size or size == 0


def test_toy_chain_in_slots() -> None:
    chain = toy_chain()
    grid = discretize(chain, 500)
    peak = store_all_peak_bytes(chain)
    assert grid.slot_bytes == -(-peak // 500)
    assert grid.top == 7 and grid.slots == 500
    assert grid.a[0] == -(-chain.input_bytes // grid.slot_bytes)
    for index in range(1, 8):
        stage = chain.stage(index)
        assert grid.a[index] * grid.slot_bytes >= stage.output_bytes > (grid.a[index] - 1) * grid.slot_bytes
        assert grid.abar[index] == -(-stage.saved_bytes // grid.slot_bytes)
        assert grid.backward_overhead[index] == -(-stage.backward_overhead_bytes // grid.slot_bytes)
        assert grid.forward_ms[index] == stage.forward_ms and grid.backward_ms[index] == stage.backward_ms
    assert grid.budget_slots(90 * 2**20) == (90 * 2**20) // grid.slot_bytes
    assert grid.to_bytes(3) == 3 * grid.slot_bytes


def test_small_integer_chain_is_exact() -> None:
    chain = Chain("ints", 3, (Stage(1.0, 2.0, 4, 6, 5, 1, 2), Stage(0.0, 0.0, 1, 1, 1)))
    grid = discretize(chain, 500)
    assert grid.slot_bytes == 1
    assert grid.a.tolist() == [3, 4, 1]
    assert grid.abar.tolist() == [3, 6, 1]
    assert grid.delta.tolist() == [3, 5, 1]
    assert grid.forward_overhead.tolist() == [0, 1, 0] and grid.backward_overhead.tolist() == [0, 2, 0]


@given(small_chains(max_length=6, max_size=1000), st.integers(1, 60))
@settings(max_examples=60, deadline=None)
def test_every_size_rounds_up(chain: Chain, slots: int) -> None:
    grid = discretize(chain, slots)
    slot = grid.slot_bytes
    exact = np.array([chain.a(i) for i in range(chain.length + 2)])
    assert (grid.a * slot >= exact).all() and ((grid.a - 1) * slot < np.maximum(exact, 1)).all()
    assert slot == max(1, -(-store_all_peak_bytes(chain) // slots))


def test_a_slot_that_divides_every_size_rounds_nothing() -> None:
    stages = tuple(Stage(1.0, 2.0, 1000, 3000, 1000, name=f"s{i}") for i in range(60))
    chain = Chain("uniform", 1000, (*stages, Stage(0.0, 0.0, 0, 0, 0)))
    grid = discretize(chain, 500, 9000)  # 18-byte slots would round 1,000 B up to 1,008 B
    assert grid.slot_bytes == 20  # the smallest divisor of 1,000 from 18 up
    assert grid.a[1] * grid.slot_bytes == 1000 and grid.abar[1] * grid.slot_bytes == 3000
    assert grid.budget_slots(9000) * grid.slot_bytes == 9000
    odd = Chain("odd", 1000, (Stage(1.0, 2.0, 1000, 3001, 1000), Stage(0.0, 0.0, 0, 0, 0)))
    assert discretize(odd, 500, 9000).slot_bytes == 18  # their common divisor, 1, is below the slot: unchanged
