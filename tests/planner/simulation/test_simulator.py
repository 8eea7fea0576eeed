"""The simulator: the paper's toy numbers, hand-computed memory, and errors at the first invalid operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InvalidScheduleError, ScheduleMismatchError
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.simulation.simulator import FRAME_COLUMNS, initial_state, predict, simulate, step
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.store_all import store_all_ops
from tests.planner.chain_strategies import MIB, small_chains, toy_chain


def ops(text: str) -> list[Op]:
    """``"F_ck 1, F_none 2, B 3"`` -> operations."""
    out = []
    for item in text.split(","):
        kind, stage = item.split()
        out.append(Op(OpKind(kind), int(stage)))
    return out


# The ROTOR paper's optimal sequence for M = 90 MB (section 3.2). As printed, its first pass reads
# "F_ck^1 F_none^2 F_all^3 F_all^4 ..", which cannot be: F_all^3 would keep a^2 for B^3, yet a^2 is
# recomputed before B^3. The stated peak (86.8 MB at B^5) and makespan (47.4 ms) are those of F_none^3.
PAPER_90MB = ops(
    "F_ck 1, F_none 2, F_none 3, F_all 4, F_all 5, F_all 6, F_all 7, B 7, B 6, B 5, B 4, "
    "F_ck 1, F_none 2, F_all 3, B 3, F_all 1, F_all 2, B 2, B 1"
)


def tiny_chain() -> Chain:
    """Two stages and a loss with distinct sizes, so every term of a memory sum is identifiable."""
    return Chain("tiny", 100, (
        Stage(1.0, 2.0, output_bytes=10, saved_bytes=30, grad_bytes=11, forward_overhead_bytes=1000,
              backward_overhead_bytes=2000),
        Stage(3.0, 4.0, output_bytes=20, saved_bytes=50, grad_bytes=21, forward_overhead_bytes=3000,
              backward_overhead_bytes=4000),
        Stage(0.5, 0.25, output_bytes=1, saved_bytes=1, grad_bytes=1),
    ))


def test_toy_store_all_matches_the_paper() -> None:
    chain = toy_chain()
    prediction = simulate(chain, store_all_ops(chain))
    assert prediction.makespan_ms == pytest.approx(37.4, abs=0.05)
    assert prediction.peak_bytes / MIB == pytest.approx(107.0, abs=0.05)
    peak_point = max(prediction.timeline, key=lambda p: p.peak_bytes)
    assert peak_point.op == Op(OpKind.B, 5)  # "The peak memory is reached when computing B^5"
    # a^0, a-bar^1..5, delta^5 held, delta^4 produced, plus o_b^5 (the paper: 79.35 MB + 27.64 MB)
    held = chain.a(0) + sum(chain.abar(i) for i in range(1, 6)) + chain.delta(5) + chain.delta(4)
    assert peak_point.peak_bytes == held + chain.stage(5).backward_overhead_bytes


def test_toy_optimal_sequence_for_90_mb_matches_the_paper() -> None:
    chain = toy_chain()
    prediction = simulate(chain, PAPER_90MB)
    assert prediction.makespan_ms == pytest.approx(47.4, abs=0.05)
    assert prediction.peak_bytes / MIB == pytest.approx(86.8, abs=0.05)
    assert prediction.peak_bytes <= 90 * MIB
    peak_point = max(prediction.timeline, key=lambda p: p.peak_bytes)
    assert peak_point.op == Op(OpKind.B, 5)


def test_memory_of_each_operation_by_hand() -> None:
    chain = tiny_chain()  # a^0 = 100, delta^3 = 1 held at the start
    sequence = ops("F_ck 1, F_all 2, F_all 3, B 3, B 2, F_all 1, B 1")
    points = simulate(chain, sequence).timeline
    expected = [
        # (memory during the op, memory after it)
        (101 + 10 + 1000, 101 + 10),  # F_ck(1): a^0, delta^3 + a^1 + o_f
        (111 + 50 + 3000, 111 + 50),  # F_all(2): keeps a^1, adds a-bar^2
        (161 + 1, 161 + 1),  # F_all(3): a-bar^3 of the loss
        (162 + 21, 100 + 10 + 50 + 21),  # B(3): frees delta^3, a-bar^3, a^2 is inside a-bar^2 so it stays
        (181 + 11 + 4000, 100 + 11),  # B(2): frees delta^2, a-bar^2 and a^1 (held on its own)
        (111 + 30 + 1000, 111 + 30),  # F_all(1)
        (141 + 100 + 2000, 100),  # B(1): frees delta^1, a-bar^1 and a^0; delta^0 (size of a^0) remains
    ]
    assert [(p.peak_bytes, p.memory_bytes) for p in points] == expected
    assert [p.start_ms for p in points] == [0.0, 1.0, 4.0, 4.5, 4.75, 8.75, 9.75]
    assert points[-1].end_ms == 11.75


def test_f_none_frees_its_input_only_when_held_on_its_own() -> None:
    chain = tiny_chain()
    after_plain = simulate(chain, ops("F_ck 1, F_none 2, F_all 3, B 3, F_all 1, F_all 2, B 2, B 1"))
    assert after_plain.live()[1] == ("a^0", "a^2", "delta^3")  # a^1 dropped
    assert after_plain.timeline[1].freed == ("a^1",) and after_plain.timeline[1].added == ("a^2",)
    inside_saved = simulate(chain, ops("F_all 1, F_none 2, F_all 2, F_all 3, B 3, B 2, B 1"))
    assert inside_saved.live()[1] == ("a^0", "abar^1", "a^2", "delta^3")  # a^1 lives on inside a-bar^1
    assert inside_saved.live()[-2] == ("a^0", "abar^1", "delta^1")  # B(2) kept a-bar^1 (Table 1, 2nd line)


def test_a_recorded_stage_pins_its_input_until_its_backward() -> None:
    chain = tiny_chain()
    # F_none(2) after F_all(2) cannot free a^1: the graph recorded by F_all(2) references it for B(2)
    prediction = simulate(chain, ops("F_ck 1, F_all 2, F_none 2, F_all 3, B 3, B 2, F_all 1, B 1"))
    assert prediction.live()[2] == ("a^0", "a^1", "abar^2", "delta^3")
    assert prediction.timeline[2].freed == ()
    assert prediction.live()[5] == ("a^0", "delta^1")  # B(2) released it


def test_recording_a_held_activation_replaces_it() -> None:
    chain = tiny_chain()
    prediction = simulate(chain, ops("F_ck 1, F_ck 2, F_all 2, F_all 3, B 3, B 2, F_all 1, B 1"))
    points = prediction.timeline
    assert prediction.live()[2] == ("a^0", "a^1", "abar^2", "delta^3")
    assert points[2].memory_bytes == 101 + 10 + 50
    assert points[2].peak_bytes == 101 + 10 + 20 + 50 + 3000  # the old a^2 is there while a-bar^2 is computed


def test_timeline_frame() -> None:
    chain = tiny_chain()
    frame = simulate(chain, store_all_ops(chain)).to_frame()
    assert tuple(frame.columns) == FRAME_COLUMNS
    assert frame["index"].tolist() == list(range(6))
    assert frame["kind"].tolist() == ["F_all", "F_all", "F_all", "B", "B", "B"]
    assert frame["stage"].tolist() == [1, 2, 3, 3, 2, 1]
    assert frame["end_ms"].iloc[-1] == 1.0 + 3.0 + 0.5 + 0.25 + 4.0 + 2.0
    assert (frame["peak_bytes"] >= frame["memory_bytes"]).all()
    assert frame["live"].iloc[-1] == "delta^0"
    assert frame["live"].iloc[2] == "a^0 abar^1 abar^2 abar^3 delta^3"


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        ("F_all 1, F_all 2, F_ck 3, B 3", "op 3 B(3): needs a-bar^3 (not in memory; a^3 is held but only F_all(3)"),
        ("F_none 1, F_all 1", "op 1 F_all(1): needs a^0 (not in memory)"),
        ("F_all 1, F_all 2, F_all 3, B 2", "op 3 B(2): needs delta^2 (the gradient in memory is delta^3)"),
        ("F_ck 1, F_none 2, F_all 3, B 3, F_all 2", "op 4 F_all(2): needs a^1 (not in memory)"),
        ("F_all 1, F_all 2, F_all 4", "op 2 F_all(4): stage 4 does not exist; the chain has stages 1..3"),
        ("F_ck 1, F_none 2, F_all 3, B 3, B 2", "op 4 B(2): needs a-bar^2 (not in memory)"),
    ],
)
def test_first_invalid_operation_is_named(sequence: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError) as excinfo:
        simulate(tiny_chain(), ops(sequence))
    assert str(excinfo.value).startswith(message)


def test_sequence_must_end_with_delta_0() -> None:
    chain = tiny_chain()
    with pytest.raises(InvalidScheduleError, match="ends after 5 operations without computing delta\\^0.*delta\\^1"):
        simulate(chain, store_all_ops(chain)[:-1])
    with pytest.raises(InvalidScheduleError, match="ends after 0 operations"):
        simulate(chain, [])


def test_nothing_may_follow_delta_0() -> None:
    chain = tiny_chain()
    with pytest.raises(InvalidScheduleError, match=r"^op 6 F_all\(1\): delta\^0 is already computed"):
        simulate(chain, [*store_all_ops(chain), Op(OpKind.F_ALL, 1)])


def test_accepts_schedules_and_pairs() -> None:
    chain = tiny_chain()
    schedule = Schedule("store_all", None, store_all_ops(chain), chain)
    pairs = [(op.kind.value, op.stage) for op in store_all_ops(chain)]
    assert simulate(chain, schedule) == simulate(chain, pairs) == simulate(chain, store_all_ops(chain))
    with pytest.raises(InvalidScheduleError, match="op 1: expected an Op or a \\(kind, stage\\) pair"):
        simulate(chain, [("F_all", 1), ("F_sometimes", 2)])


def test_refuses_a_schedule_for_another_chain() -> None:
    chain = tiny_chain()
    other = Chain("other", 100, (chain.stages[0], chain.stages[0], chain.stages[2]))
    with pytest.raises(ScheduleMismatchError, match="made for chain 'other'"):
        simulate(chain, Schedule("store_all", None, store_all_ops(other), other))


@st.composite
def chains_and_ops(draw: st.DrawFn) -> tuple[Chain, list[Op]]:
    chain = draw(small_chains(max_length=4))
    top = chain.length + 1
    if draw(st.booleans()):  # a valid schedule, from a solver
        budget = draw(st.integers(min_feasible_budget(chain, "rotor_optimal"), store_all_budget(chain)))
        return chain, list(solve(chain, budget, "rotor_optimal").ops)
    kinds = st.sampled_from(list(OpKind))
    return chain, draw(st.lists(st.builds(Op, kinds, st.integers(1, top)), max_size=3 * top))


@given(chains_and_ops())
@settings(max_examples=150, deadline=None)
def test_simulate_predict_and_step_agree(case: tuple[Chain, list[Op]]) -> None:
    chain, sequence = case
    try:
        prediction = simulate(chain, sequence)
    except InvalidScheduleError as exc:
        with pytest.raises(InvalidScheduleError) as again:
            predict(chain, sequence)
        assert str(again.value) == str(exc)
        return
    assert predict(chain, sequence) == (prediction.peak_bytes, prediction.makespan_ms)
    state = initial_state(chain)
    for point in prediction.timeline:
        state, during = step(chain, state, point.op)
        assert (state.live_bytes, during) == (point.memory_bytes, point.peak_bytes)
    assert state.live_names() == prediction.live()[-1]
