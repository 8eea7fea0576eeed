"""``MemprofCallback`` in the real ``lightning.Trainer`` on a tiny MLP, held to a plain loop and the allocator."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, ProfilerError, RunExistsError, Trace, load_trace
from memprof.units import format_bytes
from tests.allocator_truth import allocator_rise_bytes

pl = pytest.importorskip("lightning.pytorch")

from memprof.integrations.lightning import MemprofCallback  # noqa: E402 - after the skip

# Importing lightning takes about 5 s of CPU here, paid by the first test
pytestmark = pytest.mark.slow

BATCH, STEPS = 1024, 4
#: Categories that must agree exactly with the plain loop at the peak ("other" holds Lightning's own scalars).
EXACT = ["weights", "buffers", "weight_grads", "feature_maps", "grads", "optimizer_state", "inputs"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _wide() -> nn.Module:
    """Large weights and a small batch (trained with SGD, which keeps no state): at the forward's end the previous
    step's gradients outweigh the activations, and the loss's copies of the wide logits make the step's peak."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2048))


class _Lit(pl.LightningModule):  # type: ignore[misc]
    """The usual shape: the network as ``self.model``; ``training_step`` calls it, or ``self(x)``."""

    def __init__(self, call: str = "model", model: nn.Module | None = None, optimizer: type = torch.optim.AdamW) -> None:
        super().__init__()
        self.model = model if model is not None else _mlp()
        self.call, self.optimizer = call, optimizer
        self.steps = 0  # training steps run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        if self.call == "split":  # two submodules side by side, the LightningModule's forward never runs
            logits = self.model[4](self.model[:4](x))
        else:
            logits = self(x) if self.call == "self" else self.model(x)
        return nn.functional.cross_entropy(logits, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer(self.parameters(), lr=1e-3)


def _loader(batch: int = BATCH) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch * 8, 64, generator=generator), torch.randint(0, 10, (batch * 8,), generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)


def _trainer(callbacks: list[Any], **options: Any) -> Any:
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, max_steps=STEPS, callbacks=callbacks, **options)


def _fit(out: Path, call: str = "model", **callback_options: Any) -> tuple[MemprofCallback, list[str]]:
    callback = MemprofCallback(out_dir=out, print_period=0, **callback_options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([callback]).fit(_Lit(call), _loader())
    return callback, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    """The inner model profiled directly, in an ordinary loop over the same batches."""
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = _loader()  # the data set exists before profiling, as it does before fit()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("plain"), print_period=0) as profiler:
        for step, (x, y) in enumerate(loader):  # one batch alive at a time, as in the Trainer
            if step == STEPS:
                break
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            profiler.record_stats()
    return load_trace(profiler.run_dir)


def _peak_row(trace: Trace) -> Any:
    return trace.iterations.set_index("iteration").iloc[-1]  # steady state: AdamW's state exists


@pytest.mark.parametrize(("call", "profiled", "peak_module"), [("model", "model", "3"), ("self", "", "model.3")])
def test_the_module_whose_forward_runs_is_profiled_and_matches_a_plain_loop(tmp_path, plain, call, profiled,
                                                                             peak_module) -> None:
    callback, messages = _fit(tmp_path, call)
    trace = load_trace(callback.run_dir)
    assert trace.meta["profiled_module"] == profiled and trace.meta["integration"] == "lightning"
    assert trace.meta["lightning_module"] == "_Lit" and trace.meta["optimizer"] == "AdamW"
    assert not [m for m in messages if "hook fired" in m or "never the forward" in m or "memprof" in m]
    # the first optimizer step is the probe; each later one is an iteration
    assert trace.iterations.iteration.tolist() == list(range(STEPS - 1))
    ours, reference = _peak_row(trace), _peak_row(plain)
    assert {c: int(ours[c]) for c in EXACT} == {c: int(reference[c]) for c in EXACT}
    assert int(ours.feature_maps) == 2 * BATCH * 256 * 4  # what autograd saved: the two hidden ReLU outputs
    assert int(ours.inputs) == BATCH * 64 * 4  # x; the targets only the loss reads are 'other'
    weights = sum(p.numel() * 4 for p in _mlp().parameters())
    assert int(ours.weights) == weights and int(ours.optimizer_state) == 2 * weights + 4 * 6
    assert 0 <= int(ours.other) - int(reference.other) <= 4  # Lightning keeps the step's loss: one float32
    assert (ours.peak_phase, reference.peak_phase) == ("backward", "backward")
    assert ours.peak_module == peak_module


def test_the_peak_matches_the_allocator(tmp_path) -> None:
    callback, _ = _fit(tmp_path)
    measured = int(load_trace(callback.run_dir).iterations.peak_allocated_bytes.max())
    lit, loader = _Lit(), _loader()
    weights = sum(p.numel() * p.element_size() for p in lit.parameters())  # alive before fit, as in the run
    truth = weights + allocator_rise_bytes(lambda: _trainer([]).fit(lit, loader))
    # measured 5,494,980 B against 5,494,980 B on this machine
    assert abs(measured - truth) <= 0.001 * truth, (measured, truth)


def test_a_step_calling_several_submodules_warns_and_profiles_the_lightning_module(tmp_path) -> None:
    callback, messages = _fit(tmp_path, "split")
    trace = load_trace(callback.run_dir)
    assert trace.meta["profiled_module"] == "" and "side by side" in trace.meta["profiled_module_reason"]
    assert [m for m in messages if "side by side" in m and "module='<name>'" in m]
    assert [m for m in messages if "never the forward of the profiled _Lit" in m]


def test_module_skips_the_probe(tmp_path) -> None:
    callback, _ = _fit(tmp_path, module="model")
    trace = load_trace(callback.run_dir)
    assert trace.iterations.iteration.tolist() == list(range(STEPS))  # every step, the first included
    assert trace.meta["profiled_module"] == "model"


def test_accumulated_batches_are_one_iteration(tmp_path) -> None:
    callback = MemprofCallback(out_dir=tmp_path, print_period=0)
    _trainer([callback], accumulate_grad_batches=2).fit(_Lit(), _loader())  # 8 batches, 4 optimizer steps
    trace = load_trace(callback.run_dir)
    assert trace.iterations.iteration.tolist() == [0, 1, 2]
    forwards = trace.events[(trace.events.module == "") & (trace.events.event == "enter")
                            & (trace.events.phase == "forward")]
    assert forwards.groupby("iteration").size().tolist() == [2, 2, 2]


def test_bad_arguments_say_how_to_fix_them(tmp_path) -> None:
    with pytest.raises(ProfilerError, match="takes the model and optimizer from the Trainer"):
        MemprofCallback(optimizer=None)
    with pytest.raises(ProfilerError, match="has no such submodule"):
        _trainer([MemprofCallback(out_dir=tmp_path, module="encoder")]).fit(_Lit(), _loader())
    assert not list(tmp_path.iterdir())


def _plain_in_lightnings_order(out: Path, model: nn.Module, loader: torch.utils.data.DataLoader) -> Trace:
    """The model profiled in a plain loop that runs a step as Lightning's does: forward and loss, zero_grad,
    backward, SGD's step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=out, print_period=0) as profiler:
        for step, (x, y) in enumerate(loader):
            if step == STEPS:
                break
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            profiler.record_stats()
    return load_trace(profiler.run_dir)


def test_a_peak_after_the_forward_is_the_forward_pass_with_the_previous_gradients_said(tmp_path) -> None:
    console = io.StringIO()
    callback = MemprofCallback(out_dir=tmp_path, stream=console)
    _trainer([callback]).fit(_Lit(model=_wide(), optimizer=torch.optim.SGD), _loader(16))
    trace = load_trace(callback.run_dir)
    plain = _plain_in_lightnings_order(tmp_path / "plain", _wide(), _loader(16))
    # where the peak lies, from the events rows: after the model's forward returned, before its backward began
    last = int(trace.iterations.iteration.max())
    rows = trace.events[trace.events.iteration == last].sort_values("seq").reset_index(drop=True)
    peak = int(trace.iterations.set_index("iteration").peak_allocated_bytes[last])
    end = int((rows.peak_bytes == peak).idxmax())
    assert (rows.phase[end - 1], rows.module[end - 1], rows.event[end - 1]) == ("forward", "", "exit")
    assert (rows.phase[end], rows.event[end]) == ("backward", "enter")
    # that span is the forward pass's (the loss), with no module running: as the plain loop in the same order says
    ours, reference = _peak_row(trace), _peak_row(plain)
    assert (ours.peak_phase, ours.peak_module) == (reference.peak_phase, reference.peak_module) == ("forward", "")
    assert {c: int(ours[c]) for c in EXACT} == {c: int(reference[c]) for c in EXACT}
    # the previous step's gradients are alive there: Lightning calls zero_grad after training_step
    weights = (64 * 512 + 512 + 512 * 512 + 512 + 512 * 2048 + 2048) * 4
    assert int(ours.weight_grads) == weights
    report = console.getvalue()
    assert report.count("during forward, after the model's forward returned (the loss)") == STEPS - 1
    assert report.count(f"previous step's weight gradients alive at the peak: {format_bytes(weights)} (zero_grad "
                        "runs after the forward, as in Lightning's loop)") == STEPS - 1


def test_a_reused_run_id_fails_at_fit_start_in_one_line(tmp_path) -> None:
    _trainer([MemprofCallback(out_dir=tmp_path, run_id="same", print_period=0)]).fit(_Lit(), _loader())
    written = (tmp_path / "same" / "meta.json").read_bytes()
    lit = _Lit()
    with pytest.raises(RunExistsError) as caught:
        _trainer([MemprofCallback(out_dir=tmp_path, run_id="same", print_period=0)]).fit(lit, _loader())
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"run folder {tmp_path / 'same'} already holds a trace")
    assert "pass another run_id" in message
    assert lit.steps == 0 and (tmp_path / "same" / "meta.json").read_bytes() == written  # no step ran


_FIT_SCRIPT = """
import torch, lightning.pytorch as pl
from tests.memprof.integrations.test_lightning import _Lit, _loader, _trainer
from memprof.integrations.lightning import MemprofCallback
_trainer([MemprofCallback(out_dir={out!r}, print_period=1)]).fit(_Lit(), _loader())
"""


def test_c10s_line_about_blocks_older_than_profiling_is_not_printed(tmp_path) -> None:
    """Lightning's first optimizer step (the probe) runs before the profiler starts; the gradients it made are freed
    while it records, which c10 logs to the process's stderr (C++, not Python's warnings) unless memprof keeps it
    quiet. Other output to stderr is untouched."""
    done = subprocess.run([sys.executable, "-c", _FIT_SCRIPT.format(out=str(tmp_path))], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[3], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memprof | iteration 0" in done.stdout
    assert "Memory block of unknown size" not in done.stderr
    assert "`Trainer.fit` stopped" in done.stderr  # Lightning's own lines still show
