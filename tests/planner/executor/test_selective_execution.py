"""Selective schedules run on models written by others: options from a planning pass, executed with PyTorch's
selective checkpointing; gradients bitwise equal to plain autograd and the whole step's measured peak in the
prediction's band (tests/planner/prediction_band.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from memprof import load_trace
from planner import chain_from_trace, min_feasible_budget, solve, solve_held, store_all_budget
from planner.executor import apply_schedule, remove_schedule
from planner.export.files import export_python
from planner.measure.compile_baseline import memory_events, running_peak
from planner.measure.runs import measure_schedule
from planner.model.schedule import Op, OpKind, Schedule
from planner.simulation.simulator import predict
from planner.solvers import held
from tests.planner import real_models
from tests.planner.prediction_band import ABOVE, ABOVE_WITH_OPTIONS, assert_near_prediction
from tests.planner.profiled_runs import profile_steps
from tests.planner.real_models import gpt2
from tests.planner.schedule_probe import ScheduleProbe

BATCH = 4


def _profiled(build, tmp_path: Path):  # noqa: ANN001, ANN202 -- a RealModel builder
    real = build()
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    run_dir = profile_steps(real, optimizer, tmp_path / "profile", steps=3, batch_size=BATCH, ops=True)
    # These tests run the options: on the test models' small CPU blocks a selective checkpoint's own dispatch
    # costs more than any option spares, so with it priced the DP would choose none. Priced at 0, as on a
    # device whose kernels hide it. The loss runs as written: these tests hold gradients bitwise, which a chunked
    # loss gives to float rounding only (tests/planner/executor/test_chunked_schedule.py).
    return real, optimizer, chain_from_trace(load_trace(run_dir), selective_overhead_us=0.0, loss_chunks=())


def _grads(real, batch) -> list[torch.Tensor]:  # noqa: ANN001
    real.model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    real.loss(real.model, batch).backward()
    return [p.grad.clone() for p in real.model.parameters() if p.grad is not None]


def assert_exported_grads_equal(real, path: Path) -> None:  # noqa: ANN001
    """The schedule file at ``path``, imported and applied, gives ``real``'s gradients bitwise (then removed)."""
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    module.apply_schedule(real.model)
    try:
        assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True))
    finally:
        real.model.__dict__.pop("_memprof_schedule")[0].remove()


def _selective_schedules(chain):  # noqa: ANN001, ANN202
    low, high = min_feasible_budget(chain, "selective"), store_all_budget(chain)
    found = {}
    for fraction in (0.0, 0.3, 0.6):
        schedule = solve(chain, int(low + fraction * (high - low)), "selective")
        found.setdefault(schedule.ops, schedule)
    return [s for s in found.values() if any(op.option for op in s.ops)]


def test_each_option_of_each_block_gives_plain_gradients_and_its_predicted_peak(tmp_path: Path) -> None:
    real, optimizer, chain = _profiled(gpt2, tmp_path)
    base = solve(chain, store_all_budget(chain), "store_all")
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    blocks = [index for index in range(1, chain.length + 1) if chain.stage(index).options]
    assert blocks, "the blocks have recomputation options"
    for index in blocks:
        for option in range(1, len(chain.stage(index).options) + 1):
            ops = tuple(Op(op.kind, op.stage, option if op.kind is OpKind.F_ALL and op.stage == index else 0)
                        for op in base.ops)
            schedule = with_prediction(Schedule("selective", None, ops, chain))
            probe = ScheduleProbe(real.model, schedule)
            apply_schedule(real.model, schedule)
            try:
                assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True)), str(ops)
                probe.assert_ran(steps=1)  # the option's stage ran its forward again in backward (or replayed)
            finally:
                remove_schedule(real.model)
                probe.remove()
    schedule = with_prediction(Schedule("selective", None, tuple(
        Op(op.kind, op.stage, len(chain.stage(op.stage).options) if op.kind is OpKind.F_ALL and op.stage == blocks[0]
           else 0) for op in base.ops), chain))
    assert_step_peak_as_predicted(real, optimizer, schedule, tmp_path)


@pytest.mark.slow
def test_the_first_replay_of_the_backward_holds_what_its_option_predicts(tmp_path: Path) -> None:
    """The last block's replay runs when the step's memory is highest; with each of its options (everything
    else kept), the measured step peak moves from store-all's as the prediction does, to 0.25% of the peak:
    the replay's temporaries and the kept outputs no backward reads are charged
    (:mod:`planner.discovery.replay_peak`; keeping the matmuls' outputs was 69 KiB, 1.1%, above before)."""
    real, optimizer, chain = _profiled(gpt2, tmp_path)
    base = solve(chain, store_all_budget(chain), "store_all")
    last = max(index for index in range(1, chain.length + 1) if chain.stage(index).options)
    peaks = {}
    for option in range(len(chain.stage(last).options) + 1):
        ops = tuple(Op(op.kind, op.stage, option if op.kind is OpKind.F_ALL and op.stage == last else 0)
                    for op in base.ops)
        schedule = with_prediction(Schedule("selective", None, ops, chain))
        try:
            _, comparison = measure_schedule(real.model, real.make_batch, schedule, tmp_path / f"option{option}",
                                             steps=3, batch_size=BATCH, loss=real.loss, optimizer=optimizer,
                                             timed_steps=0)
        finally:
            remove_schedule(real.model)
        peaks[option] = (comparison.measured_step_peak_bytes, comparison.predicted_step_peak_bytes)
    measured_base, predicted_base = peaks[0]
    for option, (measured, predicted) in peaks.items():
        moved = (measured - measured_base) - (predicted - predicted_base)
        assert abs(moved) <= 0.0025 * predicted_base, (chain.stage(last).options[option - 1].name, peaks)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "t5", "resnet", "mobilenet"])
def test_dp_schedules_with_options_on_several_blocks_give_plain_gradients(name: str, tmp_path: Path) -> None:
    """What ``solve(..., "selective")`` picks: options on consecutive blocks, stages recomputed from F_ck
    checkpoints, dropout (GPT-2, BERT) and batch-norm statistics (ResNet, MobileNet) replayed."""
    real, optimizer, chain = _profiled(getattr(real_models, name), tmp_path)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    run_dir = next(p.parent for p in (tmp_path / "profile").rglob("meta.json"))
    by_flops = chain_from_trace(load_trace(run_dir), recompute_cost="flops",  # options' costs free of timing noise
                                loss_chunks=())
    schedules = {}
    for planned in (chain, by_flops):
        low, high = min_feasible_budget(planned, "selective"), store_all_budget(planned)
        for fraction in (0.0, 0.1, 0.3):
            schedule = solve(planned, int(low + fraction * (high - low)), "selective")
            schedules.setdefault(schedule.ops, schedule)
    lowest = next(iter(schedules.values()))
    # Which blocks the DP gives options depends on the profiled times; the lowest schedule with the last
    # option (keep the least) on every F_all that has options is a valid schedule that always has several.
    forced = with_prediction(Schedule("selective", None, tuple(
        Op(op.kind, op.stage, len(chain.stage(op.stage).options) if op.kind is OpKind.F_ALL else 0)
        for op in lowest.ops), chain))
    schedules.setdefault(forced.ops, forced)
    several = [s for s in schedules.values() if len({op.stage for op in s.ops if op.option}) >= 2]
    assert several, "the blocks have recomputation options"
    for schedule in schedules.values():
        apply_schedule(real.model, schedule)
        try:
            assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True)), str(schedule.ops)
        finally:
            remove_schedule(real.model)
    # the lowest budget's schedule: the whole step's measured peak as predicted
    assert_step_peak_as_predicted(real, optimizer, several[0], tmp_path)


def _forward_held_bytes(real, batch) -> int:  # noqa: ANN001
    """What the forward leaves allocated for the backward (the CPU allocator's events), after a warm-up."""
    real.model.zero_grad(set_to_none=True)
    real.loss(real.model, batch).backward()
    loss, events = memory_events(lambda: real.loss(real.model, batch))
    loss.backward()
    return running_peak(events)[1]


def test_held_budgets_hold_what_they_predict_and_give_plain_gradients(tmp_path: Path) -> None:
    """``solve_held``: at a tenth of store-all's held bytes (or the least the options allow), the forward
    holds what the options keep, to the allocator's byte counts, the gradients are plain autograd's, and
    the whole step's peak is in the prediction's band."""
    real, optimizer, chain = _profiled(gpt2, tmp_path)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    plain_held = _forward_held_bytes(real, batch)
    store_all = held.store_all_held_bytes(chain)
    budget = max(held.min_held_bytes(chain), store_all // 10)
    schedule = solve_held(chain, budget)
    assert sum(1 for op in schedule.ops if op.option) >= 2, "several blocks keep less than everything"
    apply_schedule(real.model, schedule)
    try:
        assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True))
        measured_cut = plain_held - _forward_held_bytes(real, batch)
    finally:
        remove_schedule(real.model)
    predicted_cut = store_all - schedule.params.held_bytes
    assert abs(measured_cut - predicted_cut) <= 0.02 * store_all, (measured_cut, predicted_cut, store_all)
    assert_step_peak_as_predicted(real, optimizer, schedule, tmp_path)


def assert_step_peak_as_predicted(real, optimizer, schedule: Schedule, tmp_path: Path) -> None:  # noqa: ANN001
    """Applies ``schedule``, measures 3 steps and checks the whole step's peak against the prediction
    (:mod:`tests.planner.prediction_band`)."""
    try:
        _, comparison = measure_schedule(real.model, real.make_batch, schedule, tmp_path / "measured", steps=3,
                                         batch_size=BATCH, loss=real.loss, optimizer=optimizer)
    finally:
        remove_schedule(real.model)
    predicted = comparison.predicted_step_peak_bytes
    options = any(op.option for op in schedule.ops)
    assert_near_prediction(comparison.measured_step_peak_bytes, predicted, real.name, schedule.algorithm,
                           above=ABOVE_WITH_OPTIONS if options else ABOVE)


def with_prediction(schedule: Schedule) -> Schedule:
    peak, makespan = predict(schedule.chain, schedule.ops)
    return schedule.with_prediction(peak, makespan)


@pytest.mark.parametrize("objective", ["peak", "held"])
def test_the_exported_file_carries_the_policies(tmp_path: Path, objective: str) -> None:
    real, _, chain = _profiled(gpt2, tmp_path)
    if objective == "peak":
        schedule = _selective_schedules(chain)[0]
    else:
        schedule = solve_held(chain, held.min_held_bytes(chain))
    path = tmp_path / "schedule.py"
    path.write_text(export_python(schedule))
    assert "POLICIES = {" in path.read_text() and "F_all[" in path.read_text()
    assert_exported_grads_equal(real, path)


def test_a_key_value_cache_passed_to_recomputed_blocks_is_refused_with_the_fix(tmp_path: Path) -> None:
    """Hugging Face models build a DynamicCache in training when asked to; a recomputed block would append its
    keys to it a second time. The executor says so instead of failing on a shape deep in attention. (A config's
    default ``use_cache=True`` is turned off by the schedule itself: tests/planner/executor/test_kv_cache.py.)"""
    real, _, chain = _profiled(gpt2, tmp_path)
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    apply_schedule(real.model, schedule)
    try:
        ids = real.make_batch(BATCH)[0]
        with pytest.raises(RuntimeError, match=r"key/value cache \(DynamicCache\).*use_cache=False"):
            real.model(input_ids=ids, labels=ids, use_cache=True).loss.backward()
    finally:
        remove_schedule(real.model)
