"""Wrapped optimizers: ``MemoryProfiler`` hooks the ``torch.optim.Optimizer`` inside a trainer's wrapper."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, ProfilerError, load_trace
from memprof.capture.optimizers import unwrap_optimizer


class _Forwarding(torch.optim.Optimizer):
    """Like accelerate's ``AcceleratedOptimizer``: an Optimizer subclass that never ran ``Optimizer.__init__``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:  # no super().__init__(), as accelerate does
        self.optimizer = optimizer

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class _Plain:
    """A DeepSpeed-style wrapper: no Optimizer at all, the real one as ``.optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


class _Lookahead(torch.optim.Optimizer):
    """An optimizer built on a base optimizer, with state of its own: not a wrapper to see through."""

    def __init__(self, base: torch.optim.Optimizer) -> None:
        super().__init__(base.param_groups, {})
        self.optimizer = base


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_unwrap_finds_the_optimizer_inside_nested_wrappers() -> None:
    adam = torch.optim.AdamW(_model().parameters())
    assert unwrap_optimizer(adam) is adam
    assert unwrap_optimizer(_Forwarding(adam)) is adam
    assert unwrap_optimizer(_Plain(_Forwarding(adam))) is adam
    assert unwrap_optimizer(None) is None
    lookahead = _Lookahead(adam)
    assert unwrap_optimizer(lookahead) is lookahead  # its state is its own


def test_something_that_holds_no_optimizer_is_refused_with_the_fix() -> None:
    with pytest.raises(ProfilerError, match=r"Pass the torch.optim.Optimizer it wraps"):
        unwrap_optimizer(object())


@pytest.mark.parametrize("wrap", [_Forwarding, _Plain], ids=["accelerate-like", "deepspeed-like"])
def test_profiler_hooks_the_optimizer_inside_a_wrapper(tmp_path, wrap) -> None:
    model = _model()
    adam = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer = wrap(adam)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.record_stats()
    trace = load_trace(profiler.run_dir)
    weights = _param_bytes(model)
    assert trace.meta["optimizer"] == "AdamW" and trace.meta["optimizer_wrapper"] == type(optimizer).__name__
    row = trace.iterations.set_index("iteration").loc[1]
    # exp_avg and exp_avg_sq per parameter, plus AdamW's float32 step counter per parameter tensor
    assert int(row.optimizer_state) == 2 * weights + 4 * len(list(model.parameters()))
    ev = trace.events
    assert (ev[ev.iteration == 1].phase == "optimizer").any()  # the step's hooks fired
    assert not adam._optimizer_step_pre_hooks and not adam._optimizer_step_post_hooks  # removed at close


def test_real_accelerate_and_lightning_wrappers_are_unwrapped(tmp_path) -> None:
    accelerate = pytest.importorskip("accelerate")
    lightning_optimizer = pytest.importorskip("lightning.pytorch.core.optimizer")
    model = _model()
    adam = torch.optim.AdamW(model.parameters())
    accelerated = accelerate.Accelerator(cpu=True).prepare_optimizer(adam)
    assert type(accelerated).__name__ == "AcceleratedOptimizer"
    assert unwrap_optimizer(accelerated) is adam
    wrapped = lightning_optimizer.LightningOptimizer(adam)
    assert unwrap_optimizer(wrapped) is adam
    # the crash a user met: MemoryProfiler(model, trainer.optimizer) raised AttributeError
    with MemoryProfiler(model, accelerated, out_dir=tmp_path, print_period=0) as profiler:
        assert profiler.optimizer is adam
