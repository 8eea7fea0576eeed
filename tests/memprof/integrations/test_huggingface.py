"""``MemprofCallback`` in the real Hugging Face ``Trainer`` (with accelerate) on a tiny GPT-2, held to numbers."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from memprof import MemoryProfiler, RunExistsError, Trace, load_trace
from tests.allocator_truth import allocator_rise_bytes
from tests.memprof.helpers import CATEGORIES

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

# Importing transformers' Trainer and accelerate takes about 5 s of CPU here, paid by the first test
pytestmark = pytest.mark.slow

from memprof.integrations.huggingface import MemprofCallback  # noqa: E402 - after the skips

BATCH, SEQ, STEPS = 4, 16, 3
#: The Trainer passes the loss's token count to the model as a float32 scalar (``num_items_in_batch``).
NUM_ITEMS_BYTES = 4


class _Tokens(torch.utils.data.Dataset):
    """Random token ids, the same for every run (seeded by index)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids.clone()}


def _gpt2() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def _trainer(out: Path, callbacks: list[Any], accumulation: int = 1, steps: int = STEPS, bf16: bool = False) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=BATCH, max_steps=steps, report_to=[],
        use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, optim="adamw_torch",
        gradient_accumulation_steps=accumulation, bf16=bf16)
    return transformers.Trainer(model=_gpt2(), args=args, train_dataset=_Tokens(), callbacks=callbacks)


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights once


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, Any, list[str]]:
    out = tmp_path_factory.mktemp("hf")
    callback = MemprofCallback(out_dir=out / "traces", print_period=0)
    trainer = _trainer(out, [callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert callback.profiler is None and callback.run_dir is not None  # closed at train end
    return load_trace(callback.run_dir), trainer, [str(w.message) for w in caught]


def test_every_optimizer_step_is_an_iteration_and_the_run_is_closed(profiled) -> None:
    trace, trainer, messages = profiled
    assert trace.iterations.iteration.tolist() == list(range(STEPS))
    meta = trace.meta
    assert (meta["status"], meta["iterations"], meta["integration"]) == ("closed", STEPS, "huggingface")
    assert (meta["model"], meta["optimizer"], meta["optimizer_wrapper"]) == (
        "GPT2LMHeadModel", "AdamW", "AcceleratedOptimizer")
    assert meta["gradient_accumulation_steps"] == 1
    assert not [m for m in messages if "hook fired" in m or "never the forward" in m]
    model = trainer.model
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # hooks removed


def test_the_keyword_batch_is_inputs_and_model_state_is_exact(profiled) -> None:
    trace, trainer, _ = profiled
    model = trainer.model
    weights = _param_bytes(model)
    tensors = len(list(model.parameters()))
    rows = trace.iterations.set_index("iteration")
    # input_ids and labels, int64 batch x seq each, passed as model(input_ids=..., labels=...)
    assert rows.inputs.tolist() == [2 * BATCH * SEQ * 8 + NUM_ITEMS_BYTES] * STEPS
    assert rows.weights.tolist() == [weights] * STEPS
    # AdamW: exp_avg and exp_avg_sq per parameter and a float32 step counter per tensor, from its first step on
    assert rows.optimizer_state.loc[1:].tolist() == [2 * weights + 4 * tensors] * (STEPS - 1)
    assert set(rows.peak_phase) <= {"forward", "backward"}
    assert (rows.feature_maps > 0).all()


def test_the_peak_matches_the_allocator(profiled, tmp_path) -> None:
    trace, _, _ = profiled
    ev = trace.events
    start = int(ev[(ev.iteration == 0) & (ev.event == "start")].allocated_bytes.iloc[0])
    measured = int(trace.iterations.peak_allocated_bytes.max()) - start  # the rise since train begin
    truth = allocator_rise_bytes(_trainer(tmp_path, []).train)  # the same training, unprofiled
    # measured 913,208 B against 913,212 B: the Trainer's loss accumulator (4 B) is made before train begin
    assert abs(measured - truth) <= 0.001 * truth, (measured, truth)


def test_gradient_accumulation_records_one_iteration_per_optimizer_step(tmp_path) -> None:
    callback = MemprofCallback(out_dir=tmp_path / "traces", print_period=0)
    _trainer(tmp_path, [callback], accumulation=2, steps=2).train()
    trace = load_trace(callback.run_dir)
    assert trace.iterations.iteration.tolist() == [0, 1]
    assert trace.meta["gradient_accumulation_steps"] == 2
    # the Trainer fetches both micro-batches before the first forward: both are alive at the peak
    assert trace.iterations.inputs.tolist() == [2 * (2 * BATCH * SEQ * 8) + NUM_ITEMS_BYTES] * 2
    forwards = trace.events[(trace.events.module == "") & (trace.events.event == "enter")
                            & (trace.events.phase == "forward")]
    assert forwards.groupby("iteration").size().tolist() == [2, 2]  # two micro-batches per iteration


def test_callback_refuses_a_model_of_its_own() -> None:
    from memprof import ProfilerError

    with pytest.raises(ProfilerError, match="takes the model and optimizer from the Trainer"):
        MemprofCallback(model=torch.nn.Linear(2, 2))


def test_bf16_files_the_weight_casts_as_plain_autocast_does(tmp_path) -> None:
    """accelerate enters autocast inside the model's call (its forward is wrapped), where the model's own hooks see
    it off: the casts are found all the same, as with ``torch.autocast`` around a plain loop's forward."""
    steps = 6
    callback = MemprofCallback(out_dir=tmp_path / "traces", print_period=0, detail_first=1, detail_every=0)
    _trainer(tmp_path, [callback], steps=steps, bf16=True).train()
    trace = load_trace(callback.run_dir)
    model, ids = _gpt2(), torch.stack([_Tokens()[i]["input_ids"] for i in range(BATCH)])
    optimizer = torch.optim.AdamW(model.parameters())
    with MemoryProfiler(model, optimizer, out_dir=tmp_path / "plain", print_period=0, detail_first=1,
                        detail_every=0) as profiler:
        for _ in range(steps):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            profiler.record_stats()
    plain = load_trace(profiler.run_dir)
    # bfloat16 casts that autograd saved: each block's Conv1D weights (c_attn 32x96, c_proj 32x32, c_fc 32x128,
    # mlp.c_proj 128x32) and the lm_head's, tied to wte (128x32): 2 bytes an element
    copies = 2 * (2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32) + 128 * 32)
    assert copies == 57_344
    assert trace.iterations.weight_copies.tolist() == plain.iterations.weight_copies.tolist() == [copies] * steps
    # steps run without the submodules' hooks too (-2: the one after the epoch's end, whose batches differ)
    assert (trace.iterations.template_iteration != -1).any()
    rows, events = trace.iterations, trace.events
    assert (rows[CATEGORIES].sum(axis=1) == rows.peak_allocated_bytes).all()
    assert (events[CATEGORIES].sum(axis=1) == events.allocated_bytes).all()
    start = int(events[(events.iteration == 0) & (events.event == "start")].allocated_bytes.iloc[0])
    measured = int(rows.peak_allocated_bytes.max()) - start
    truth = allocator_rise_bytes(_trainer(tmp_path / "bare", [], steps=steps, bf16=True).train)
    assert abs(measured - truth) <= 0.001 * truth, (measured, truth)


def test_a_reused_run_id_fails_at_train_begin_in_one_line(tmp_path) -> None:
    traces = tmp_path / "traces"
    _trainer(tmp_path, [MemprofCallback(out_dir=traces, run_id="same", print_period=0)], steps=1).train()
    written = (traces / "same" / "meta.json").read_bytes()
    trainer = _trainer(tmp_path, [MemprofCallback(out_dir=traces, run_id="same", print_period=0)], steps=1)
    forwards: list[int] = []
    trainer.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    with pytest.raises(RunExistsError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"run folder {traces / 'same'} already holds a trace")
    assert "pass another run_id" in message
    assert forwards == [] and (traces / "same" / "meta.json").read_bytes() == written  # nothing ran, nothing written
