"""The loss stage's chunked options end to end on a GPT-2 whose logits dominate its activations: found in the
trace, chosen by the selective DP at low budgets, applied in place and exported, gradients equal to plain
autograd's to float rounding, and the whole step's measured peak (allocator truth) as the simulator predicts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from memprof import load_trace
from planner import chain_from_trace, min_feasible_budget, solve, store_all_budget
from planner.discovery.loss_options import without_weight_grads
from planner.executor import apply_schedule, remove_schedule
from planner.executor.apply import loss_chunks
from planner.export.files import export_python
from planner.measure.runs import measure_schedule
from tests.allocator_truth import allocator_rise_bytes
from tests.planner.prediction_band import ABOVE_WITH_OPTIONS, assert_near_prediction
from tests.planner.profiled_runs import profile_steps
from tests.planner.real_models import RealModel

BATCH, SEQ, VOCAB = 4, 64, 4096
RTOL, ATOL = 1e-5, 1e-7  # docs/planner.md, "The loss stage's options": chunking reorders float32 sums


def _gpt2() -> RealModel:
    """GPT-2, 6 blocks of 128, a 4096-token vocabulary: the logits and their log-softmax (8 MiB at 4 x 64
    tokens) outweigh any block's activations and set the chain's minimum budget, as GPT-2 small's do."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    settings: dict[str, Any] = dict(vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=6, n_head=4,
                                    use_cache=False, attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0,
                                    attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(GPT2Config(**settings))
    model.loss_type = "ForCausalLM"
    model.train()

    def make_batch(n: int) -> tuple:
        ids = torch.randint(0, VOCAB, (n, SEQ))
        labels = ids.clone()
        labels[:, :5] = -100  # a prompt whose tokens are not predicted
        return ids, labels

    def loss(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        return model(input_ids=batch[0], labels=batch[1]).loss

    return RealModel("gpt2", model, make_batch, loss, tuple(f"transformer.h.{i}" for i in range(6)))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[RealModel, torch.optim.Optimizer, Path]:
    real = _gpt2()
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    return real, optimizer, profile_steps(real, optimizer, tmp_path_factory.mktemp("profile"), steps=3,
                                          batch_size=BATCH, ops=True)


def _grads(real: RealModel, batch: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
    real.model.zero_grad(set_to_none=True)
    loss = real.loss(real.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in real.model.parameters() if p.grad is not None]


def _assert_close(expected: tuple, found: tuple) -> None:
    torch.testing.assert_close(found[0], expected[0], rtol=RTOL, atol=ATOL)
    assert len(found[1]) == len(expected[1])
    for a, b in zip(found[1], expected[1], strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_the_loss_options_lower_the_minimum_activation_budget(profiled) -> None:  # noqa: ANN001
    real, _, run_dir = profiled
    trace = load_trace(run_dir)
    chain, plain = chain_from_trace(trace), chain_from_trace(trace, loss_chunks=())
    assert all(any(block in stage.modules for stage in chain.stages[:-1]) for block in real.blocks), \
        chain.module_names  # the chain of blocks; the head and the loss after it are the loss stage
    names = [option.name for option in chain.stages[-1].options]
    assert "chunks=16" in names and "chunks=16 eager" in names, names
    assert not plain.stages[-1].options
    # the chain's activations alone (the paper's M less the parameter gradients, which the end of the backward
    # holds whatever the schedule): benchmark 10's activations budget, whose minimum the issue reads
    with_options = min_feasible_budget(without_weight_grads(chain.activations_only()), "selective")
    plain_activations = without_weight_grads(plain.activations_only())
    without = min_feasible_budget(plain_activations, "selective")
    assert without == min_feasible_budget(plain_activations, "rotor")
    assert with_options <= 0.75 * without, (with_options, without)
    # with the parameter gradients (memprof plan --activation-budget) it drops by the loss's part too
    assert min_feasible_budget(chain.activations_only(), "selective") < min_feasible_budget(plain.activations_only(),
                                                                                            "selective")


def test_the_lowest_schedule_chunks_the_loss_and_is_exact_and_as_predicted(profiled, tmp_path: Path) -> None:  # noqa: ANN001
    real, optimizer, run_dir = profiled
    chain = chain_from_trace(load_trace(run_dir))
    schedule = solve(chain, min_feasible_budget(chain, "selective"), "selective")
    chunks, _ = loss_chunks(schedule)
    assert chunks > 0, schedule.ops
    top = solve(chain, store_all_budget(chain), "selective")
    assert loss_chunks(top) == (0, False)  # with room for the logits, the loss runs as written (it is faster)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    apply_schedule(real.model, schedule)
    try:
        _assert_close(plain, _grads(real, batch))
    finally:
        remove_schedule(real.model)
    assert "_loss_function" not in real.model.__dict__  # removed with the schedule
    _, comparison = measure_schedule(real.model, real.make_batch, schedule, tmp_path / "measured", steps=3,
                                     batch_size=BATCH, loss=real.loss, optimizer=optimizer)
    remove_schedule(real.model)
    baseline = solve(chain, store_all_budget(chain), "store_all")
    measured, predicted = comparison.measured_step_peak_bytes, comparison.predicted_step_peak_bytes
    assert measured is not None and predicted is not None and baseline.predicted_step_peak_bytes is not None
    assert_near_prediction(measured, predicted, real.name, schedule.algorithm, above=ABOVE_WITH_OPTIONS)
    assert predicted < baseline.predicted_step_peak_bytes


@pytest.mark.parametrize("eager", [False, True])
def test_every_loss_option_applied_and_exported_gives_plain_gradients(profiled, tmp_path: Path, eager: bool) -> None:  # noqa: ANN001
    real, _, run_dir = profiled
    chain = chain_from_trace(load_trace(run_dir))
    store_all = solve(chain, store_all_budget(chain), "store_all")
    top = chain.length + 1
    option = next(k for k, o in enumerate(chain.stages[-1].options, start=1) if o.eager == eager and o.chunks == 4)
    ops = tuple(type(op)(op.kind, op.stage, option if op.stage == top and op.kind.value == "F_all" else 0)
                for op in store_all.ops)
    from planner.model.schedule import Schedule

    schedule = Schedule("selective", None, ops, chain)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    path = tmp_path / "schedule.py"
    path.write_text(export_python(schedule))
    assert f"LOSS_CHUNKS = [4, {eager}]" in path.read_text()
    spec = importlib.util.spec_from_file_location("exported_chunked", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.apply_schedule(real.model)
    try:
        _assert_close(plain, _grads(real, batch))
        assert type(real.model.lm_head.__dict__["forward"]).__name__ == "_HeadForward"
    finally:
        real.model.__dict__.pop("_memprof_schedule")[0].remove()
        module.remove_chunked_head(real.model)
    assert "forward" not in real.model.lm_head.__dict__


def test_where_the_gradients_exist_the_lowest_schedule_holds_what_it_predicts(profiled) -> None:  # noqa: ANN001
    """Budgets on the activations alone (benchmark 10's), as when every parameter's ``.grad`` exists: the eager loss
    adds its head's gradient into ``.grad`` and the embeddings their rows (planner.executor.grad_into,
    embedding_grad), and ``AccumulateGrad`` adds the others and frees them; the chain counts that
    (``param_grad_bytes``, ``existing_grads_overhead_bytes``), and the lowest schedule's forward and backward,
    measured with the allocator on a step whose gradients exist, peak as the simulator predicts."""
    real, _, run_dir = profiled
    full = chain_from_trace(load_trace(run_dir))
    wte, first = real.model.transformer.wte.weight, full.stages[0]
    assert first.existing_grads_overhead_bytes is not None
    assert first.backward_overhead_bytes - first.existing_grads_overhead_bytes >= wte.nbytes  # no dense gradient
    chain = without_weight_grads(full.activations_only())
    assert [s.backward_overhead_bytes for s in chain.stages] == [s.existing_grads_overhead_bytes for s in full.stages]
    schedule = solve(chain, min_feasible_budget(chain, "selective"), "selective")
    assert loss_chunks(schedule)[0] > 0, schedule.ops
    batch = real.make_batch(BATCH)
    apply_schedule(real.model, schedule)
    try:
        real.loss(real.model, batch).backward()  # every .grad exists from here on
        measured = allocator_rise_bytes(lambda: real.loss(real.model, batch).backward())
    finally:
        remove_schedule(real.model)
        real.model.zero_grad(set_to_none=True)
    predicted = schedule.predicted_peak_bytes
    assert predicted is not None
    assert_near_prediction(measured, predicted, real.name, schedule.algorithm, above=ABOVE_WITH_OPTIONS)
