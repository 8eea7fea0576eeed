"""The simulator's rules for recomputation options, every peak and makespan computed by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.errors import InvalidScheduleError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.stage_option import StageOption
from planner.simulation.simulator import initial_state, predict, simulate, step

F_ALL, F_CK, B, OFFLOAD = OpKind.F_ALL, OpKind.F_CK, OpKind.B, OpKind.OFFLOAD


def chain(forward_overhead: int = 1, backward_overhead: int = 2) -> Chain:
    """a^0 = 2; stage 1: a = 3, a-bar = 10, options keeping 6 (0.5 ms) and 3 (1 ms); the loss: 1 byte."""
    options = (StageOption(name="compute", saved_bytes=6, recompute_ms=0.5),
               StageOption(name="none", saved_bytes=3, recompute_ms=1.0))
    first = Stage(1.0, 2.0, 3, 10, 3, forward_overhead, backward_overhead, name="s1", options=options)
    return Chain("options", 2, (first, Stage(0.5, 0.5, 1, 1, 1, name="loss")))


def ops(option: int) -> list[Op]:
    return [Op(F_ALL, 1, option), Op(F_ALL, 2), Op(B, 2), Op(B, 1)]


def test_option_keeps_less_and_backward_recomputes() -> None:
    # start: a^0 + delta^2 = 3. F_all(1)[1]: 3 + 6 + o_f 1 = 10, holds 9; F_all(2): 10, holds 10;
    # B(2): 10 + delta^1 3 = 13, holds 11; B(1): 11 + (10 - 6) + delta^0 2 + o_b 2 = 19 (recompute 11 + 4 + 1 = 16)
    prediction = simulate(chain(), ops(1))
    assert [p.peak_bytes for p in prediction.timeline] == [10, 10, 13, 19]
    assert [p.memory_bytes for p in prediction.timeline] == [9, 10, 11, 2]
    assert prediction.peak_bytes == 19
    assert prediction.makespan_ms == pytest.approx(1.0 + 0.5 + 0.5 + 2.0 + 0.5)
    # option 2 keeps a^1 only: 3 + 3 + 1 = 7, ..., B(1): 8 + 7 + 2 + 2 = 19; 1 ms recomputed
    prediction = simulate(chain(), ops(2))
    assert [p.peak_bytes for p in prediction.timeline] == [7, 7, 10, 19]
    assert prediction.makespan_ms == pytest.approx(5.0)
    # option 0 as before: 14, 14, 17, 19 and no recomputation
    assert predict(chain(), ops(0)) == (19, pytest.approx(4.0))


def test_the_recomputation_can_be_the_peak_of_the_backward() -> None:
    # o_f = 5, o_b = 0: F_all(1)[1] 3 + 6 + 5 = 14; B(1): backward 11 + 4 + 2 = 17, recompute 11 + 4 + 5 = 20
    assert simulate(chain(5, 0), ops(1)).timeline[-1].peak_bytes == 20
    assert predict(chain(5, 0), ops(0))[0] == 18  # without the option: F_all(1) 3 + 10 + 5


def test_a_partial_replay_holds_its_own_overhead_when_it_exceeds_the_forwards() -> None:
    # option 1 replays with 7 bytes above a-bar (temporaries, kept outputs no backward reads):
    # B(1)'s recomputation 11 + 4 + 7 = 22 over its backward's 19; below o_f the rule keeps o_f
    replaying = replace(chain(), stages=(replace(chain().stages[0], options=(
        replace(chain().stages[0].options[0], recompute_overhead_bytes=7), chain().stages[0].options[1])),
        chain().stages[1]))
    assert replaying.stages[0].recompute_overhead_with(1) == 7
    assert simulate(replaying, ops(1)).timeline[-1].peak_bytes == 22
    assert simulate(replaying, ops(2)).timeline[-1].peak_bytes == 19  # option 2 has none of its own
    light = replace(replaying, stages=(replace(replaying.stages[0], forward_overhead_bytes=9), replaying.stages[1]))
    assert light.stages[0].recompute_overhead_with(1) == 9  # never below o_f
    again = Chain.from_json(replaying.to_dict())
    assert again.stages[0].options[0].recompute_overhead_bytes == 7 and again == replaying
    assert "recompute_overhead_bytes" not in chain().to_dict()["stages"][0]["options"][0]


def test_a_new_recording_replaces_the_held_one() -> None:
    # F_all(1)[1]: holds 9; F_all(1)[2]: 9 + 3 + 1 = 13 during, then holds 9 - 6 + 3 = 6; B recomputes option 2's 1 ms
    sequence = [Op(F_ALL, 1, 1), Op(F_ALL, 1, 2), Op(F_ALL, 2), Op(B, 2), Op(B, 1)]
    prediction = simulate(chain(), sequence)
    assert [p.peak_bytes for p in prediction.timeline][:2] == [10, 13]
    assert prediction.timeline[1].memory_bytes == 6
    assert prediction.makespan_ms == pytest.approx(1.0 + 1.0 + 0.5 + 0.5 + 2.0 + 1.0)


def test_the_state_remembers_the_option() -> None:
    state, during = step(chain(), initial_state(chain()), Op(F_ALL, 1, 2))
    assert during == 7 and state.option_of(1) == 2 and state.options == frozenset({(1, 2)})
    state, _ = step(chain(), state, Op(F_ALL, 1))
    assert state.option_of(1) == 0 and state.live_bytes == 13


def test_invalid_options() -> None:
    with pytest.raises(InvalidScheduleError, match=r"op 0 F_all\(1\)\[3\]: stage 1 has 2 recomputation options"):
        simulate(chain(), [Op(F_ALL, 1, 3), Op(F_ALL, 2), Op(B, 2), Op(B, 1)])
    with pytest.raises(InvalidScheduleError, match="picks option 3, but stage 1 has 2"):
        Schedule("selective", None, (Op(F_ALL, 1, 3),), chain())
    with pytest.raises(InvalidScheduleError, match="only F_all takes a recomputation option"):
        Op(F_CK, 1, 1)
    with pytest.raises(InvalidScheduleError, match="only a full recording"):
        simulate(chain(), [Op(F_ALL, 1, 1), Op(OFFLOAD, 1), Op(F_ALL, 2), Op(B, 2), Op(B, 1)])


def test_schedule_json_round_trip_keeps_the_options() -> None:
    schedule = Schedule("selective", 19, tuple(ops(2)), chain()).with_prediction(*predict(chain(), ops(2)))
    text = schedule.to_json()
    assert '"F_all",\n      1,\n      2' in text
    again = Schedule.from_json(text)
    assert again.ops == schedule.ops and again.chain == schedule.chain
    assert again.chain.stages[0].options == chain().stages[0].options
    assert str(again.ops[0]) == "F_all(1)[2]"
    with pytest.raises(InvalidScheduleError, match="option 'x'; expected an integer"):
        Schedule.from_json({**schedule.to_dict(), "ops": [["F_all", 1, "x"]]})
