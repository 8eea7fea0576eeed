"""``ForwardProbe`` and ``choose_root``: the module whose forward a training step calls."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprof.integrations.probe import ForwardProbe, choose_root


class _Wrapper(nn.Module):
    """Like a LightningModule: holds the model and a head; which forward runs depends on the step."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(x))


def _probe(step) -> list[str]:
    wrapper = _Wrapper()
    probe = ForwardProbe(wrapper)
    step(wrapper, torch.randn(3, 4))
    probe.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in wrapper.modules())
    return probe.outermost


def test_the_root_is_chosen_when_its_own_forward_runs() -> None:
    outermost = _probe(lambda w, x: w(x).sum().backward())
    assert outermost == [""]
    choice = choose_root(_Wrapper(), outermost)
    assert choice.name == "" and choice.certain


def test_the_one_submodule_called_is_chosen() -> None:
    wrapper = _Wrapper()
    outermost = _probe(lambda w, x: w.model(x).sum().backward())
    assert outermost == ["model"]
    choice = choose_root(wrapper, outermost)
    assert choice.name == "model" and choice.module is wrapper.model and choice.certain
    assert "calls _Wrapper.model and not _Wrapper's own forward" in choice.reason


def test_submodules_called_side_by_side_fall_back_to_the_root_uncertain() -> None:
    outermost = _probe(lambda w, x: w.head(w.model(x)).sum().backward())
    assert outermost == ["model", "head"]  # nested calls (model.0, model.1) are not outermost
    choice = choose_root(_Wrapper(), outermost)
    assert choice.name == "" and not choice.certain and "side by side" in choice.reason


def test_a_forward_that_raises_leaves_the_probe_balanced() -> None:
    wrapper = _Wrapper()
    probe = ForwardProbe(wrapper)
    with pytest.raises(RuntimeError):
        wrapper.model(torch.randn(3, 5))  # wrong width: Linear raises inside model
    wrapper.head(torch.randn(3, 8))
    probe.remove()
    assert probe.outermost == ["model", "head"]
