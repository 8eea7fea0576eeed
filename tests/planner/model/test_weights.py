"""Weight costs on the chain and the simulator's rules for streamed weights (hand-computed replays)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.errors import ChainError, InvalidScheduleError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Schedule
from planner.model.step import StepCosts
from planner.model.transfer import TransferCosts
from planner.model.weights import WeightCosts, streamed_step
from planner.simulation.simulator import predict_with_host, simulate
from planner.simulation.weight_streams import next_runs
from tests.planner import models as M


def two_stages() -> Chain:
    """Two stages of 100-byte activations and a loss; weights 10 and 20 bytes; a 10-bytes-per-ms link."""
    stages = (Stage(1.0, 2.0, 100, 100, 100), Stage(1.0, 2.0, 100, 100, 100), Stage(0.5, 0.5, 10, 10, 100))
    return Chain("two", 100, stages, transfer=TransferCosts(10.0, 10.0),
                 weights=WeightCosts((10, 20), (10, 20), (0, 0)))


def test_a_store_all_replay_with_both_stages_streamed_matches_the_hand_computation() -> None:
    chain = two_stages()
    plain = simulate(chain, M.store_all(2))
    got = simulate(chain, M.store_all(2), streamed=[1, 2])
    assert (plain.peak_bytes, plain.makespan_ms) == (510, 7.0)
    # F1 waits 1 ms for its own weights (nothing ran before it); W2 arrives during F1 (1..3 ms), so F2 waits
    # to 3 ms; W1 (the next streamed run, B1) comes back from F2's start (3..4 ms) and stays through the loss;
    # B2's gradient (20 bytes, 2 ms) leaves 7..9 ms, B1's 9..10 ms.
    assert [p.peak_bytes for p in got.timeline] == [330, 430, 440, 540, 550, 440]
    assert [(p.start_ms, p.end_ms) for p in got.timeline] == [(1.0, 2.0), (3.0, 4.0), (4.0, 4.5), (4.5, 5.0),
                                                              (5.0, 7.0), (7.0, 9.0)]
    assert got.peak_bytes == 550 and got.makespan_ms == 10.0
    assert got.host_peak_bytes == 60  # both stages' parameters and gradients, all the time
    assert predict_with_host(chain, M.store_all(2), [1, 2]) == (550, 10.0, 60)


def test_gradients_kept_without_streaming_are_freed_after_a_streamed_backward() -> None:
    base = two_stages()
    stages = tuple(Stage(1.0, 2.0, 100, 100, 100, weight_grad_bytes=20) for _ in range(3)) + (base.stages[-1],)
    chain = Chain("kept", 100, stages, transfer=TransferCosts(float("inf"), float("inf")),
                  weights=WeightCosts((20, 20, 20), (20, 20, 20), (0, 0, 0)))
    plain = simulate(chain, M.store_all(3))
    got = simulate(chain, M.store_all(3), streamed=[3])
    assert plain.timeline[-1].memory_bytes == 100 + 60  # delta^0 and every stage's gradients stay
    assert got.timeline[-1].memory_bytes == 100 + 40  # stage 3's went to the host (retired before B(1))
    assert got.timeline[-2].memory_bytes == plain.timeline[-2].memory_bytes  # in flight through B(2)
    assert got.makespan_ms == plain.makespan_ms  # an infinitely fast link hides every copy


def test_the_next_streamed_run_is_copied_in_over_every_computation_before_it() -> None:
    stages = tuple(Stage(1.0, 1.0, 10, 10, 10) for _ in range(4)) + (Stage(0.0, 0.0, 1, 1, 1),)
    chain = Chain("four", 10, stages, transfer=TransferCosts(10.0, 10.0), weights=WeightCosts((15,) * 4, (0,) * 4,
                                                                                               (0,) * 4))
    # stages 2 and 4 streamed: W2 (1.5 ms) crosses during F1 and W4 during F2..F3 (copy from F2's start):
    # one computation alone (1 ms) would not hide either; with the window of every computation since the
    # previous streamed run, only W2's first copy costs 0.5 ms
    got = simulate(chain, M.store_all(4), streamed=[2, 4])
    assert got.makespan_ms == simulate(chain, M.store_all(4)).makespan_ms + 0.5
    assert next_runs([1, 2, 3, 3, 2, 1], {2}) == [2, 2, 2, 2, None, None]
    assert next_runs([1, 2, 2, 1], {1, 2}) == [2, 1, 1, None]


def test_nothing_streamed_replays_as_before_and_errors_are_named() -> None:
    chain = two_stages()
    assert simulate(chain, M.store_all(2), streamed=[]) == simulate(chain, M.store_all(2))
    with pytest.raises(InvalidScheduleError, match=r"outside 1..2"):
        simulate(chain, M.store_all(2), streamed=[3])
    with pytest.raises(InvalidScheduleError, match="no weight costs"):
        simulate(chain.with_weights(None), M.store_all(2), streamed=[1])
    capped = chain.with_transfer(TransferCosts(10.0, 10.0, host_cap_bytes=50))
    with pytest.raises(InvalidScheduleError, match="host cap"):
        simulate(capped, M.store_all(2), streamed=[1, 2])


def test_a_schedule_carries_its_streamed_stages_through_json() -> None:
    chain = two_stages()
    schedule = Schedule("handmade", None, tuple(M.store_all(2)), chain, params={"streamed_weights": [2]})
    loaded = Schedule.from_json(schedule.to_json())
    assert loaded.streamed_weights == (2,) and loaded.chain.weights == chain.weights
    assert simulate(chain, loaded).peak_bytes == simulate(chain, M.store_all(2), streamed=[2]).peak_bytes
    old = Chain.from_json({k: v for k, v in chain.to_dict().items() if k != "weights"})
    assert old.weights is None and "weights" not in old.to_dict()
    assert Schedule("x", None, tuple(M.store_all(2)), chain).streamed_weights == ()


def test_weight_costs_are_validated() -> None:
    with pytest.raises(ChainError, match="one entry per stage"):
        WeightCosts((1, 2), (1,), (0, 0))
    with pytest.raises(ChainError, match="whole numbers"):
        WeightCosts((-1,), (1,), (0,))
    with pytest.raises(ChainError, match="lack"):
        WeightCosts.from_dict({"param_bytes": [1]})
    with pytest.raises(ChainError, match="one entry per stage"):
        two_stages().with_weights(WeightCosts((1,), (1,), (0,)))


def test_streaming_takes_the_stages_resident_state_out_of_the_step() -> None:
    step = StepCosts(model_state_bytes=1000, inputs_bytes=10, outside_bytes=0, before_peak_bytes=1100,
                     after_peak_bytes=1500, weights_bytes=400, optimizer_state_bytes=600, weight_grad_bytes=400)
    weights = WeightCosts((100, 300), (100, 300), (150, 450))
    moved = weights.step_without(step, [2])
    assert moved.model_state_bytes == 1000 - 300 - 450
    assert moved.after_peak_bytes == 1500 - 300 - 450 - 300  # its gradients too: the optimizer runs on the host
    assert moved.weights_bytes == 100 and moved.optimizer_state_bytes == 150
    assert weights.host_bytes([2]) == 300 + 300 + 450
    held = WeightCosts((100, 300), (100, 300), (150, 450), grads_in_state=True)
    assert held.step_without(replace(step, model_state_bytes=1400), [2]).model_state_bytes == 1400 - 300 - 450 - 300
    chain = two_stages().with_step(step)
    assert streamed_step(chain, []) is step and streamed_step(chain.with_weights(None), [1]) is step
    assert weights.transient_bound_bytes([1, 2], [100, 0]) == 400 + 2 * 300
