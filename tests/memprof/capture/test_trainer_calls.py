"""How trainers call the model and the optimizer: a batch by keyword, and ``optimizer.step(closure)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace


class _Regressor(nn.Module):
    """Takes its batch the way a Hugging Face model does: ``model(x=..., y=...)`` returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 64)
        self.out = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return nn.functional.mse_loss(self.out(torch.relu(self.hidden(x))), y)


@pytest.mark.parametrize("call", ["keywords", "mixed"])
def test_tensors_passed_by_keyword_to_the_root_are_inputs(tmp_path, call) -> None:
    torch.manual_seed(0)
    model = _Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            x, y = torch.randn(32, 16), torch.randn(32, 4)
            loss = model(x=x, y=y) if call == "keywords" else model(x, y=y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del x, y, loss  # one batch alive at a time
            profiler.record_stats()
    rows = load_trace(profiler.run_dir).iterations
    assert rows.inputs.tolist() == [32 * 16 * 4 + 32 * 4 * 4] * 2  # x and y, float32, by hand


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_step_with_a_closure_marks_the_optimizer_after_the_closure(tmp_path, how) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)  # noqa: B023 - called before x changes
                loss.backward()
                return loss

            loss = optimizer.step(closure) if how == "positional" else optimizer.step(closure=closure)
            assert loss is not None and loss.ndim == 0  # the closure's loss still comes back
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    ev = trace.events[trace.events.iteration == 1].reset_index(drop=True)
    labels = list(zip(ev.phase, ev.module, ev.event))
    forward_enter = labels.index(("forward", "", "enter"))
    backward_end = labels.index(("backward", "", "end"))
    optimizer_enter = labels.index(("optimizer", "", "enter"))
    assert forward_enter < backward_end < optimizer_enter < labels.index(("optimizer", "", "exit"))
    # a small model, a large AdamW update: the peak is the optimizer's own, and named so
    assert trace.iterations.set_index("iteration").loc[1].peak_phase == "optimizer"
