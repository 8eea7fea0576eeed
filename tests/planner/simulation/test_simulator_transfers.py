"""The simulator's transfers: memory and time by hand, the retirement points, and errors at the first invalid one."""

from __future__ import annotations

import math

import pytest

from planner.errors import InvalidScheduleError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.transfer import TransferCosts
from planner.simulation.simulator import predict, predict_with_host, simulate


def ops(text: str) -> list[Op]:
    """``"F_all 1, OFFLOAD 1, B 2"`` -> operations."""
    return [Op(OpKind(kind), int(stage)) for kind, stage in (item.split() for item in text.split(","))]


def chain(d2h: float = 10.0, h2d: float = 5.0, cap: int | None = None) -> Chain:
    """Two stages and a loss: a-bar^1 - a^1 = 20 bytes, a-bar^2 - a^2 = 30 bytes."""
    return Chain("tiny", 100, (
        Stage(1.0, 2.0, output_bytes=10, saved_bytes=30, grad_bytes=11),
        Stage(3.0, 4.0, output_bytes=20, saved_bytes=50, grad_bytes=21),
        Stage(0.5, 0.25, output_bytes=1, saved_bytes=1, grad_bytes=1),
    ), transfer=TransferCosts(d2h, h2d, cap))


OFFLOAD_ONE = "F_all 1, OFFLOAD 1, F_all 2, F_all 3, B 3, PREFETCH 1, B 2, B 1"


def test_memory_and_time_of_an_offload_by_hand() -> None:
    prediction = simulate(chain(), ops(OFFLOAD_ONE))
    points = prediction.timeline
    # (start, end, memory after, memory during, host after)
    expected = [
        (0.0, 1.0, 131, 131, 0),  # F_all(1): a^0 + delta^3 + a-bar^1
        (1.0, 3.0, 131, 131, 20),  # OFFLOAD(1): 20 bytes at 10 B/ms; the device keeps them until retired
        (1.0, 4.0, 181, 181, 20),  # F_all(2) runs beside the copy
        (4.0, 4.5, 162, 162, 20),  # F_all(3) is the loss: the copy (ended at 3.0) is retired first: -20
        (4.5, 4.75, 181, 183, 20),  # B(3)
        (4.75, 8.75, 201, 201, 20),  # PREFETCH(1): +20 on the device at once, 4 ms at 5 B/ms
        (4.75, 8.75, 141, 212, 20),  # B(2) runs beside it
        (8.75, 10.75, 100, 241, 0),  # B(1) needs it: retired (ended at 8.75, no wait), the host buffer returned
    ]
    assert [(p.start_ms, p.end_ms, p.memory_bytes, p.peak_bytes, p.host_bytes) for p in points] == expected
    assert [p.stream for p in points] == ["compute", "d2h", "compute", "compute", "compute", "h2d", "compute",
                                          "compute"]
    assert prediction.makespan_ms == 10.75  # store-all's time: the copies are hidden
    assert prediction.host_peak_bytes == 20
    assert prediction.live()[3] == ("a^0", "a^1", "abar^2", "abar^3", "delta^3")  # a^1 stays on the device
    assert prediction.live()[5] == ("a^0", "abar^1", "abar^2", "delta^2")
    assert predict_with_host(chain(), ops(OFFLOAD_ONE)) == (241, 10.75, 20)


def test_the_compute_stream_waits_for_a_slow_copy_where_it_is_retired() -> None:
    slow = chain(d2h=2.0, h2d=1.0)  # 10 ms out, 20 ms back
    points = simulate(slow, ops(OFFLOAD_ONE)).timeline
    assert points[1].end_ms == 11.0
    assert points[3].start_ms == 11.0  # the loss waits for the offload: 7 ms
    assert points[5].start_ms == 11.75 and points[5].end_ms == 31.75
    assert points[7].start_ms == 31.75  # B(1) waits for the prefetch: 16 ms beyond B(2)
    assert simulate(slow, ops(OFFLOAD_ONE)).makespan_ms == 33.75


def test_one_copy_in_flight_per_direction() -> None:
    # OFFLOAD(2) retires OFFLOAD(1) (waiting for it); PREFETCH(1) retires PREFETCH(2)
    sequence = ops("F_all 1, OFFLOAD 1, F_all 2, OFFLOAD 2, F_all 3, B 3, PREFETCH 2, PREFETCH 1, B 2, B 1")
    points = simulate(chain(d2h=1.0, h2d=1.0), sequence).timeline
    assert points[3].start_ms == 21.0  # OFFLOAD(1) ran 1 .. 21; F_all(2) ended at 4
    assert points[3].memory_bytes == 181 - 20  # a-bar^1 - a^1 left the device when retired
    assert points[4].start_ms == 51.0  # the loss retires OFFLOAD(2): 30 bytes, 21 .. 51
    assert points[7].start_ms == 81.75  # PREFETCH(1) waits for PREFETCH(2) (51.75 .. 81.75)
    assert points[8].start_ms == 81.75 and points[9].start_ms == 101.75


def test_zero_bandwidth_takes_forever() -> None:
    _, makespan = predict(chain(d2h=0.0), ops(OFFLOAD_ONE))
    assert math.isinf(makespan)


@pytest.mark.parametrize(("sequence", "message"), [
    ("F_all 1, OFFLOAD 1, F_all 2, F_all 3, B 3, B 2, B 1",
     r"op 6 B\(1\): needs a-bar\^1 in device memory \(it is in host memory; PREFETCH\(1\) must come before B\(1\)\)"),
    ("F_all 1, OFFLOAD 3", r"op 1 OFFLOAD\(3\): the loss \(stage 3\) cannot be offloaded"),
    ("F_ck 1, OFFLOAD 1", r"op 1 OFFLOAD\(1\): needs a-bar\^1 in device memory \(only what F_all\(1\) recorded"),
    ("F_all 1, OFFLOAD 1, OFFLOAD 1", r"op 2 OFFLOAD\(1\): a-bar\^1 is already offloaded"),
    ("F_all 1, PREFETCH 1", r"op 1 PREFETCH\(1\): needs a-bar\^1 in host memory \(it is not offloaded"),
    ("F_all 1, OFFLOAD 1, F_all 1", r"op 2 F_all\(1\): a-bar\^1 is offloaded; F_all\(1\) cannot record it again"),
    ("F_all 1, OFFLOAD 1, PREFETCH 1, PREFETCH 1", r"op 3 PREFETCH\(1\): needs a-bar\^1 in host memory \(it is not"),
])
def test_invalid_transfers_name_the_first_bad_operation(sequence: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError, match=message):
        simulate(chain(), ops(sequence))


def test_the_host_cap_is_enforced() -> None:
    sequence = ops("F_all 1, OFFLOAD 1, F_all 2, OFFLOAD 2, F_all 3, B 3, PREFETCH 2, B 2, PREFETCH 1, B 1")
    assert simulate(chain(cap=50), sequence).host_peak_bytes == 50
    with pytest.raises(InvalidScheduleError, match=r"op 3 OFFLOAD\(2\): host memory would hold 50 bytes, above "
                                                   r"the chain's host cap of 49 bytes"):
        simulate(chain(cap=49), sequence)


def test_a_prefetch_right_after_its_offload_retires_it_first() -> None:
    prediction = simulate(chain(), ops("F_all 1, OFFLOAD 1, PREFETCH 1, F_all 2, F_all 3, B 3, B 2, B 1"))
    assert prediction.timeline[2].start_ms == 3.0  # the offload's copy (1 .. 3) is retired, then copied back
    assert prediction.live()[2] == ("a^0", "abar^1", "delta^3")
    assert prediction.host_peak_bytes == 20 and prediction.timeline[-1].host_bytes == 0


def test_schedules_with_transfers_round_trip_through_json() -> None:
    schedule = Schedule("offload", 300, tuple(ops(OFFLOAD_ONE)), chain(), predicted_host_peak_bytes=20)
    again = Schedule.from_json(schedule.to_json())
    assert again.ops == schedule.ops and again.predicted_host_peak_bytes == 20
    assert again.chain.transfer == chain().transfer
    assert again.has_transfers and not Schedule("x", None, (Op(OpKind.F_ALL, 1),), chain()).has_transfers
    with pytest.raises(InvalidScheduleError, match="predicted_host_peak_bytes must be a whole number"):
        Schedule.from_json({**schedule.to_dict(), "predicted_host_peak_bytes": -1})
