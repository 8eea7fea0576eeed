"""Every memory category against an oracle that does not come from memprof's attribution.

Model state and inputs are computed by hand from the shapes. Feature maps, activation gradients (``grads``)
and ``other`` come from :mod:`tests.memprof.category_oracle`: the test's own autograd hooks say where each
tensor lives, the allocator's raw events (torch.profiler) say how much is allocated, at the same moments of
the same step. A gradient filed as a feature map, a saved tensor filed as ``other``, a lost allocation or a
double count each move a number these tests compare exactly.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from tests.memprof.category_oracle import CategoryOracle, Moment
from tests.memprof.helpers import CATEGORIES

N, D, H = 48, 96, 160  # batch, model width, hidden width: every size below is distinct
F32 = 4
_COMPARED = {("forward", "exit"), ("backward", "enter"), ("optimizer", "enter"), ("optimizer", "exit")}


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.BatchNorm1d(H), nn.GELU(), nn.Linear(H, H, bias=False), nn.ReLU(),
                         nn.Linear(H, D))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """A training step whose target is made inside it (so it is neither an input nor model state: ``other``)."""
    optimizer.zero_grad(set_to_none=True)
    target = torch.ones(N, D)
    loss = ((model(x) - target) ** 2).sum()
    loss.backward()
    optimizer.step()


def _batch() -> torch.Tensor:
    return torch.randn(N, D)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Moment], list[dict[str, object]]]:
    """The oracle's moments of a steady-state step, and memprof's rows for the same moments of the same step."""
    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):  # Adam's state exists, as in memprof's third iteration below
        _step(model, optimizer, _batch())
    oracle = CategoryOracle(model, optimizer)
    try:
        moments = oracle.run(lambda x: _step(model, optimizer, x), _batch())
    finally:
        oracle.remove()

    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("oracle"), print_period=0,
                        background=False) as profiler:
        for _ in range(3):
            x = _batch()  # one batch alive at a time, as with a data loader
            _step(model, optimizer, x)
            profiler.record_stats()
            del x
    events = load_trace(profiler.run_dir).events
    last = events[events.iteration == 2].sort_values("seq")
    rows = [row for row in last.to_dict("records") if (row["phase"], row["event"]) in _COMPARED]
    return moments, rows


def test_the_oracle_and_memprof_see_the_same_moments(measured) -> None:
    moments, rows = measured
    assert [m.key for m in moments] == [(r["phase"], r["module"], r["event"]) for r in rows]
    assert len(moments) == 2 * 7 + 2  # six modules and the root, forward and backward; the optimizer step


@pytest.mark.parametrize("category", [*CATEGORIES, "allocated_bytes"])
def test_each_category_is_the_oracles_at_every_moment(measured, category: str) -> None:
    moments, rows = measured
    expected = [m.categories[category] for m in moments]
    found = [int(r[category]) for r in rows]
    assert found == expected, [(m.key, e, f) for m, e, f in zip(moments, expected, found) if e != f]


def test_model_state_and_inputs_are_the_hand_computed_bytes(measured) -> None:
    _, rows = measured
    weights = ((D * H + H) + (H + H) + H * H + (H * D + D)) * F32  # Linear, BatchNorm's affine, Linear, Linear
    buffers = 2 * H * F32 + 8  # BatchNorm's running mean and variance, its int64 batch counter
    for row in rows:
        assert (row["weights"], row["buffers"], row["inputs"]) == (weights, buffers, N * D * F32), row
        # Adam: two moments per parameter and a float32 step counter per parameter tensor (7 of them)
        assert row["optimizer_state"] == 2 * weights + 7 * F32
    by_key = {(r["phase"], r["module"], r["event"]): r for r in rows}
    assert by_key[("forward", "", "exit")]["weight_grads"] == 0  # zero_grad(set_to_none=True)
    assert by_key[("backward", "4", "enter")]["weight_grads"] == (H * D + D) * F32  # the last Linear's, alone
    assert by_key[("optimizer", "", "enter")]["weight_grads"] == weights


def test_activation_gradients_and_feature_maps_by_hand(measured) -> None:
    """Known by construction: during backward one activation gradient flows (the module output's, N*D or
    N*H floats), and what autograd saved for the modules below is still held."""
    _, rows = measured
    by_key = {(r["phase"], r["module"], r["event"]): r for r in rows}
    assert by_key[("backward", "5", "enter")]["grads"] == N * D * F32
    for module in "43210":
        assert by_key[("backward", module, "enter")]["grads"] == N * H * F32, module
    # The first Linear saves only the batch (an input); nothing of the forward is held once its gradient flows.
    assert by_key[("backward", "0", "enter")]["feature_maps"] == 0
    assert by_key[("optimizer", "", "enter")]["feature_maps"] == 0
    assert by_key[("optimizer", "", "enter")]["grads"] == 0
