"""The rule that hands the worker's records to the training thread (memprof.capture.worker_judge)."""

from __future__ import annotations

from memprof.capture.worker_judge import JUDGE_RECORDS, SETTLE_RECORDS, Switch, WorkerJudge


def test_nothing_is_judged_before_the_worker_settled() -> None:
    judge = WorkerJudge()
    judge.waited(10.0)
    assert all(judge.verdict(answered, 1.0 + answered, 100) is None for answered in range(SETTLE_RECORDS))


def test_a_window_in_which_training_waited_half_the_workers_cpu_switches() -> None:
    judge = WorkerJudge()
    judge.waited(5.0)  # before the window: not counted
    assert judge.verdict(SETTLE_RECORDS, 1.0, 20) is None  # the window opens
    judge.waited(0.021)  # over half of the worker's 40 ms
    assert judge.verdict(SETTLE_RECORDS + JUDGE_RECORDS - 1, 1.02, 45) is None  # not a whole window yet
    switch = judge.verdict(SETTLE_RECORDS + JUDGE_RECORDS, 1.04, 46)
    assert isinstance(switch, Switch) and switch.to_meta() == {
        "iteration": 47, "records": JUDGE_RECORDS, "worker_cpu_ms": 40.0, "waited_ms": 21.0}


def test_a_window_with_less_waiting_keeps_the_worker_and_opens_the_next() -> None:
    judge = WorkerJudge()
    assert judge.verdict(SETTLE_RECORDS, 1.0, 20) is None
    judge.waited(0.0199)  # just under half of the worker's 40 ms
    assert judge.verdict(SETTLE_RECORDS + JUDGE_RECORDS, 1.04, 60) is None
    assert judge.verdict(SETTLE_RECORDS + JUDGE_RECORDS + 1, 1.041, 61) is None  # the next window opens, from 0
    judge.waited(0.015)  # the second window: 15 ms of the worker's 39 ms
    assert judge.verdict(SETTLE_RECORDS + 2 * JUDGE_RECORDS + 1, 1.08, 93) is None
    judge.waited(0.03)  # before the third window opens: not counted
    assert judge.verdict(SETTLE_RECORDS + 2 * JUDGE_RECORDS + 2, 1.08, 94) is None
    assert judge.verdict(SETTLE_RECORDS + 3 * JUDGE_RECORDS + 2, 1.12, 130) is None  # 0 waited in that one


def test_a_worker_that_reported_no_cpu_is_never_found_behind() -> None:
    judge = WorkerJudge()
    assert judge.verdict(SETTLE_RECORDS, 0.0, 20) is None
    judge.waited(1.0)
    assert judge.verdict(SETTLE_RECORDS + JUDGE_RECORDS, 0.0, 60) is None  # (an older worker: no cpu_s)
