"""The partial replay (planner/executor/partial.py) on small functions: plain autograd's gradients and RNG,
only the cone replayed, dropped tensors freed, batch-norm statistics moved once, and clear refusals."""

from __future__ import annotations

import gc
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from planner.executor.partial import run_partial


def _plain(thunk: Callable[[], Any]) -> Any:
    return thunk()


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(6, 12), nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.5, training=True))


def _step(model: nn.Module, x: torch.Tensor, policy: tuple | None, counter: _Counter | None = None) -> list:
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    torch.manual_seed(3)
    out = model(x) if policy is None else run_partial(model, x, policy, _plain)
    with counter if counter is not None else torch.enable_grad():
        out.pow(2).sum().backward()
    return [x.grad, *(p.grad for p in model.parameters()), torch.get_rng_state()]


@pytest.mark.parametrize("policy", [(), (("aten.addmm.default", 0),), (("aten.gelu.default", 0),),
                                    (("aten.mul.Tensor", 0),), (("aten.addmm.default", 0), ("aten.mul.Tensor", 0)),
                                    (("aten.div_.Scalar", 0),)])
def test_gradients_and_the_rng_after_backward_are_plain_autograds(policy: tuple) -> None:
    model, x = _Mlp(), torch.randn(4, 6)
    plain = _step(model, x, None)
    got = _step(model, x, policy)
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))


def test_backward_replays_only_what_the_dropped_tensors_need() -> None:
    model, x = _Mlp(), torch.randn(4, 6)
    plain, partial = _Counter(), _Counter()
    _step(model, x, None, plain)
    # fc1's output kept: gelu's saved input is kept; the dropout's mask and output are replayed from it, and
    # the transposed weights the matmuls saved are views of parameters, kept as they are
    _step(model, x, (("aten.addmm.default", 0),), partial)
    # (autograd detaches what an unpack hook hands back: not a replayed op)
    replayed = Counter(partial.ops) - Counter(plain.ops) - Counter({"aten.detach.default": len(partial.ops)})
    assert replayed == Counter(["aten.gelu.default", "aten.empty_like.default", "aten.bernoulli_.float",
                                "aten.div_.Scalar", "aten.mul.Tensor"])
    assert Counter(plain.ops) - Counter(partial.ops) == Counter()


def test_dropped_tensors_are_freed_after_the_forward_and_kept_ones_are_not() -> None:
    x = torch.randn(64, 64, requires_grad=True)
    refs: list[weakref.ref] = []

    def f(v: torch.Tensor) -> torch.Tensor:
        y = v.sin()
        refs.append(weakref.ref(y))
        return y.cos().sum()

    for policy, alive in [((), False), ((("aten.sin.default", 0),), True)]:
        refs.clear()
        out = run_partial(f, x, policy, _plain)
        gc.collect()
        assert (refs[0]() is not None) is alive
        out.backward()
        assert torch.equal(x.grad, -torch.sin(x.sin()) * torch.cos(x))
        x.grad = None


def test_a_kept_output_changed_in_place_is_refused() -> None:
    w = torch.randn(4, 4, requires_grad=True)

    def f(v: torch.Tensor) -> torch.Tensor:
        y = v @ w
        y.relu_()
        return y.sin()

    with pytest.raises(RuntimeError, match=r"which the option keeps, was changed in place after it was made"):
        run_partial(f, torch.randn(3, 4, requires_grad=True), (("aten.mm.default", 0),), _plain)


@pytest.mark.parametrize("policy", [(), (("aten.native_batch_norm.default", 0),)])
def test_batch_norm_statistics_move_once_and_gradients_are_plain(policy: tuple) -> None:
    """native_batch_norm writes its running statistics without its schema saying so: the replay writes copies."""
    def build() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 5))

    x = torch.randn(6, 5)
    plain_model, model = build(), build()
    plain = _step(plain_model, x, None)
    got = _step(model, x, policy)
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    for a, b in zip(plain_model.buffers(), model.buffers(), strict=True):
        assert torch.equal(a, b)


def test_saved_tensors_it_keeps_go_through_the_hooks_around_it() -> None:
    model, x = _Mlp(), torch.randn(4, 6)
    plain = _step(model, x, None)
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = _step(model, x, (("aten.gelu.default", 0),))
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    # the stage's input and transposed weights (made before it) and, after the stage, the loss's input; not the
    # saved tensors the stage dropped (fc1's output, the dropout's mask and output)
    assert len(packed) == 4


def test_a_replayed_write_into_a_view_of_a_tensor_made_before_the_stage_is_refused() -> None:
    buffer = torch.ones(4)

    def f(v: torch.Tensor) -> torch.Tensor:
        scale = buffer[:2]
        scale.mul_(2.0)  # the forward writes the buffer once; replaying this op would write it again
        return (v * scale).sin().sum()

    out = run_partial(f, torch.randn(3, 2, requires_grad=True), (), _plain)
    with pytest.raises(RuntimeError, match="would write in place into a tensor the stage keeps or was given"):
        out.backward()
    assert torch.equal(buffer, torch.tensor([2.0, 2.0, 1.0, 1.0]))


def test_a_second_backward_through_the_stage_is_refused() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    out = run_partial(lambda v: v.sin().cos().sum(), x, (), _plain)
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="unpacked a second time"):
        out.backward()
