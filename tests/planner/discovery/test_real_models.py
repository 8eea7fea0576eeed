"""The planner on models written by others: Hugging Face transformers and torchvision-style CNNs.

For each model: the chain is found at block level in its trace, schedules are applied in place (the model's
own forward keeps calling its blocks) and run (each stage's forward calls counted: the schedule's
recomputations happen), gradients are bitwise those of plain autograd, the whole training step's peak measured
with the allocator (torch.profiler's raw memory events) is within the band of ``prediction_band.py`` around the
prediction, and at the minimum feasible budget the step saves what was predicted (on five models, a quarter of
the step's peak or more; on all seven, within 1% of what no schedule lowers).
"""

from __future__ import annotations

import copy

import pytest
import torch

from memprof import MemoryProfiler, load_trace
from planner import (
    ALGORITHMS,
    Chain,
    InfeasibleBudgetError,
    apply_schedule,
    chain_from_trace,
    min_feasible_budget,
    solve,
    store_all_budget,
)
from planner.executor import remove_schedule
from planner.executor.apply import loss_chunks
from planner.measure.runs import measure_schedule
from tests.allocator_truth import allocator_rise_bytes
from tests.planner.prediction_band import assert_near_prediction, assert_saving_as_predicted
from tests.planner.real_models import ALL_BUILDERS, RealModel
from tests.planner.schedule_probe import ScheduleProbe

pytestmark = pytest.mark.slow

BATCH = 2
EXPECTED_CHAINS = {
    "gpt2": ["transformer.drop", *(f"transformer.h.{i}" for i in range(4)), "transformer.ln_f"],
    "bert": [f"bert.encoder.layer.{i}" for i in range(8)],
    "llama": [*(f"model.layers.{i}" for i in range(4)), "model.norm"],
    "t5": [*(f"encoder.block.{i}" for i in range(3)), "encoder.final_layer_norm"],
    "resnet": ["conv1", "bn1", "maxpool", *(f"layer{s}.{b}" for s in range(1, 5) for b in range(2)), "avgpool", "fc"],
    "mobilenet": [f"features.{i}" for i in range(10)],
    "vit": ["encoder.dropout", *(f"encoder.layers.encoder_layer_{i}" for i in range(4)), "encoder.ln"],
}


def _train(real: RealModel, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple) -> None:
    optimizer.zero_grad(set_to_none=True)
    real.loss(model, batch).backward()
    optimizer.step()


def _profile(real: RealModel, out_dir, ops: bool = False) -> tuple[Chain, dict]:
    """The model trained for 3 steps under the profiler (``ops``: iteration 1 is a planning pass) and its chain."""
    model = real.model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=False, ops=ops) as profiler:
        for _ in range(3):
            batch = real.make_batch(BATCH)  # one batch alive at a time, as with a data loader
            _train(real, model, optimizer, batch)
            profiler.record_stats()
    extra = {"optimizer": optimizer, "batch": batch, "run_dir": profiler.run_dir}
    return chain_from_trace(load_trace(profiler.run_dir)), extra


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def allocator_step_peak(real: RealModel, model, optimizer, batch) -> int:
    """The whole step's peak: what is allocated at its start plus the highest rise of torch.profiler's events."""
    _train(real, model, optimizer, batch)  # optimizer state exists, as in the profiled steps
    optimizer.zero_grad(set_to_none=True)
    state = [t for s in optimizer.state.values() for t in s.values()]
    start = _storage_bytes([*model.parameters(), *model.buffers(), *state, *batch])
    return start + allocator_rise_bytes(lambda: _train(real, model, optimizer, batch))


def _grads(real: RealModel, model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss and gradients, on one intra-op thread: compared bit for bit, and with several threads a busy
    machine once gave GPT-2's plain and scheduled losses a last-bit difference (the same ops, the same inputs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss = real.loss(model, batch)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=sorted(ALL_BUILDERS))
def profiled(request, tmp_path_factory):
    torch.manual_seed(0)
    real = ALL_BUILDERS[request.param]()
    chain, extra = _profile(real, tmp_path_factory.mktemp(request.param))
    return real, chain, extra


def test_chain_is_found_at_block_level(profiled) -> None:
    real, chain, _ = profiled
    found = [m for stage in chain.stages[:-1] for m in stage.modules if m != "relu"]
    blocks = [m for m in EXPECTED_CHAINS[real.name] if m in real.blocks]
    assert [m for m in found if m in blocks] == blocks  # every block is a stage of its own, in order
    assert set(found) <= set(EXPECTED_CHAINS[real.name])
    assert chain.step is not None and chain.source["auto"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_schedules_give_plain_gradients_and_the_predicted_step_peak(profiled, algorithm: str) -> None:
    real, chain, extra = profiled
    model, optimizer, batch = real.model, extra["optimizer"], extra["batch"]
    try:
        budget = store_all_budget(chain) if algorithm == "store_all" else min_feasible_budget(chain, algorithm)
    except InfeasibleBudgetError:
        pytest.skip(f"{algorithm} has no schedule for this chain at any budget")
    schedule = solve(chain, budget, algorithm)
    assert schedule.predicted_step_peak_bytes is not None and schedule.predicted_step_peak_bytes <= budget
    reference = copy.deepcopy(model)
    ref_loss, ref_grads = _grads(real, reference, batch)
    probe = ScheduleProbe(model, schedule)
    apply_schedule(model, schedule)
    try:
        loss, grads = _grads(real, model, batch)
        assert grads.keys() == ref_grads.keys()
        if loss_chunks(schedule)[0]:  # the head and its loss in chunks: within docs/planner.md's "Exactness"
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0.0)
            for name in grads:
                scale = float(ref_grads[name].abs().max())
                assert float((grads[name] - ref_grads[name]).abs().max()) <= 1e-5 * scale, name
        else:
            assert torch.equal(loss, ref_loss)
            assert all(torch.equal(grads[name], ref_grads[name]) for name in grads)
        measured = allocator_step_peak(real, model, optimizer, batch)
        probe.assert_ran(steps=3)  # the executor ran the schedule in the three steps, recomputations counted
    finally:
        remove_schedule(model)
        probe.remove()
    predicted = schedule.predicted_step_peak_bytes
    assert_near_prediction(measured, predicted, real.name, algorithm)


# On llama and resnet at these test sizes the step's minimum is set by what no schedule lowers (every parameter
# gradient allocated at the end of backward beside the first stages' activations; the convolutions' backward
# workspace): predicted 77% and 99% of store-all's step peak, against 47-67% on the others.
# There the minimum is checked to sit on what no schedule lowers instead (on every model, see below).
CUT_BY_A_QUARTER = ("bert", "gpt2", "mobilenet", "t5", "vit")


def least_any_schedule_needs(chain: Chain) -> int:
    """A lower bound of every schedule's step peak: the step's floor, or what stays beside the chain plus the
    most that one stage's forward or backward needs with nothing else of the chain held, in its lightest option
    (Table 1 of the ROTOR paper, as planner/simulation/memory_rules.py applies it): a^0 always; ``F_all(l)``
    a^{l-1}, a-bar_k^l and o_f; ``B(l)`` a^{l-1}, a-bar_k^l and what it regrows, delta^l, delta^{l-1} and the
    parameter gradients of stages l and after, which stay to the optimizer step (an eager loss holds its own
    in a-bar_k), and o_b. Counting only these, the bound is the same on any machine's kernels."""
    top = chain.length + 1
    grads = [chain.stage(number).weight_grad_bytes for number in range(1, top + 1)]
    most = 0
    for number in range(1, top + 1):
        stage = chain.stage(number)
        inputs = chain.a(0) + (chain.a(number - 1) if number > 1 else 0)
        made = chain.delta(number - 1) + grads[number - 1]
        needs = []
        for k in range(len(stage.options) + 1):
            held = inputs + stage.saved_with(k)
            eager = bool(k) and stage.options[k - 1].eager
            needs.append(max(held + stage.forward_overhead_with(k),
                             held + stage.regrown_with(k) + chain.delta(number) + sum(grads[number:])
                             + (0 if eager else made) + stage.backward_overhead_with(k)))
        most = max(most, min(needs))
    return max(chain.step.floor_bytes, chain.step.base_bytes + most)


def test_minimum_budget_saves_what_was_predicted(profiled, tmp_path) -> None:
    real, chain, extra = profiled
    optimizer = extra["optimizer"]
    measured, predicted = {}, {}
    for name, budget in (("store_all", store_all_budget(chain)), ("rotor", min_feasible_budget(chain))):
        schedule = solve(chain, budget, name)
        model = real.model
        probe = ScheduleProbe(model, schedule)
        try:
            _, comparison = measure_schedule(model, real.make_batch, schedule, tmp_path / name, steps=3,
                                             batch_size=BATCH, loss=real.loss, optimizer=optimizer, timed_steps=1)
            probe.assert_ran(steps=3 + 1)  # the profiled steps and the one timed without the profiler
        finally:
            remove_schedule(model)
            probe.remove()
        measured[name], predicted[name] = comparison.measured_step_peak_bytes, comparison.predicted_step_peak_bytes
        assert_near_prediction(measured[name], predicted[name], real.name, name)
    # below store-all's peak by what was predicted
    assert_saving_as_predicted(measured["store_all"] - measured["rotor"], predicted["store_all"] - predicted["rotor"],
                               predicted["store_all"], real.name)
    if real.name in CUT_BY_A_QUARTER:
        # On the whole step, not the activations: the schedules the DP may pick at the minimum (which depends on
        # the measured times) reach the same step peak, but GPT-2's kept 39% or 53% of store-all's activation
        # peak, at another moment of the step, by the machine's timings.
        assert measured["rotor"] <= 0.75 * measured["store_all"], measured
    else:
        assert "no schedule changes" in chain.step.explain_floor()
    # The minimum sits on what no schedule lowers (within the DP's slot rounding: measured 0.2-0.45% above on all
    # seven models). This used to be "the floor outside the chain is over 85% of the minimum", which holds only
    # where the convolutions' backward workspace is small: 98-99% here (oneDNN's AVX-512 kernels), but on an AVX2
    # CPU at one intra-op thread that workspace, inside layer4's stages, makes the ResNet's minimum 7,046,820 B
    # against a 5,726,984 B floor (81%; 61% at two threads), whatever the machine's load.
    least, minimum = least_any_schedule_needs(chain), min_feasible_budget(chain)
    assert least <= predicted["rotor"] <= minimum <= 1.01 * least, (least, predicted, minimum)


def test_exported_file_applies_to_a_fresh_copy(profiled, tmp_path) -> None:
    import importlib.util

    from planner.export.files import export_python

    real, chain, extra = profiled
    schedule = solve(chain, min_feasible_budget(chain), "rotor")
    path = tmp_path / f"apply_{real.name}.py"
    path.write_text(export_python(schedule))
    spec = importlib.util.spec_from_file_location(f"apply_{real.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = copy.deepcopy(real.model)
    ref_loss, ref_grads = _grads(real, copy.deepcopy(fresh), extra["batch"])
    module.apply_schedule(fresh)
    loss, grads = _grads(real, fresh, extra["batch"])
    assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
    assert all(torch.equal(grads[name], ref_grads[name]) for name in grads)


def test_offload_schedules_between_the_extremes_run_as_predicted(profiled) -> None:
    """Halfway between rotor's minimum and store-all, the offload schedule runs with plain gradients and the
    predicted step peak (the executor copies host to host here). At the default 24 GB/s the copies hide behind
    these CPU-timed stages, so every model whose blocks record much more than their output offloads some; the
    ResNet's blocks record little besides it, and whether offloading one wins depends on the timings."""
    real, chain, extra = profiled
    model, optimizer, batch = real.model, extra["optimizer"], extra["batch"]
    budget = (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2
    schedule = solve(chain, budget, "offload")
    if real.name != "resnet":
        assert schedule.has_transfers and schedule.predicted_host_peak_bytes > 0
    ref_loss, ref_grads = _grads(real, copy.deepcopy(model), batch)
    probe = ScheduleProbe(model, schedule)
    apply_schedule(model, schedule)
    try:
        loss, grads = _grads(real, model, batch)
        assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
        assert all(torch.equal(grads[name], ref_grads[name]) for name in grads)
        measured = allocator_step_peak(real, model, optimizer, batch)
        probe.assert_ran(steps=3)
    finally:
        remove_schedule(model)
        probe.remove()
    predicted = schedule.predicted_step_peak_bytes
    assert_near_prediction(measured, predicted, real.name)


def test_t5_decoder_blocks_with_the_encoders_output_carried(tmp_path) -> None:
    """Each decoder block reads the encoder's output (made before this chain) through two projections, k and
    v: its six gradients are added one by one in backward order, as plain autograd adds them, so the encoder's
    gradients are bitwise equal too (summing each block's pair first would change their float rounding)."""
    from tests.planner.real_models import t5

    torch.manual_seed(0)
    real = t5()
    _, extra = _profile(real, tmp_path)
    chain = chain_from_trace(load_trace(extra["run_dir"]), container="decoder.block")
    model, optimizer, batch = real.model, extra["optimizer"], extra["batch"]
    for algorithm in ("rotor", "selective"):
        schedule = solve(chain, min_feasible_budget(chain, algorithm), algorithm)
        ref_loss, ref_grads = _grads(real, copy.deepcopy(model), batch)
        apply_schedule(model, schedule)
        try:
            loss, grads = _grads(real, model, batch)
            measured = allocator_step_peak(real, model, optimizer, batch)
        finally:
            remove_schedule(model)
        assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
        assert all(torch.equal(grads[name], ref_grads[name]) for name in grads), algorithm
        predicted = schedule.predicted_step_peak_bytes
        assert_near_prediction(measured, predicted, "t5", algorithm)
