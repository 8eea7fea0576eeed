"""The phase and module of a step's peak, and what the console says of it, in a plain loop.

Between the model's forward returning and its backward beginning a training step computes its loss (and
Lightning's loop runs ``zero_grad`` there). That span belongs to the forward pass: a peak in it reads ``forward``,
with no module (none of the model's runs), where it read ``other`` before. The expectations are computed from the
events rows (where the peak lies) and from the parameters' shapes (the gradients' bytes), not read from memprof.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, Trace, load_trace
from memprof.units import format_bytes
from tests.memprof.helpers import CATEGORIES

STEPS = 5


def _mlp(width: int, classes: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, classes))


def _run(tmp_path, model: nn.Sequential, batch: int, zero_grad_after_forward: bool,  # noqa: ANN001
         detail_first: int = 1) -> tuple[Trace, str]:
    """``STEPS`` steps; the ``detail_first`` first keep their detail, the others are summarised (the later ones
    steady)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the same allocations every step
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 32, generator=generator)
    y = torch.randint(0, model[-1].out_features, (batch,), generator=generator)
    console = io.StringIO()
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, stream=console, detail_first=detail_first, detail_every=0,
                        background=False) as profiler:
        for _ in range(STEPS):
            if not zero_grad_after_forward:
                optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x) * 2.0, y)  # the scaled logits: the loss's own tensor
            if zero_grad_after_forward:  # Lightning's order: training_step, zero_grad, backward
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            profiler.record_stats()
    return load_trace(profiler.run_dir), console.getvalue()


def _peak_window(trace: Trace, iteration: int) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """The events rows around the iteration's peak: the row before the window it lies in, and the row ending it."""
    rows = trace.events[trace.events.iteration == iteration].sort_values("seq").reset_index(drop=True)
    peak = int(trace.iterations.set_index("iteration").peak_allocated_bytes[iteration])
    end = int((rows.peak_bytes == peak).idxmax())
    label = lambda i: (rows.phase[i], rows.module[i], rows.event[i])  # noqa: E731
    return label(end - 1), label(end)


def _weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_loss_that_makes_the_peak_is_the_forward_pass(tmp_path) -> None:
    model = _mlp(64, 1024)  # 256 x 1024 logits: the loss's copies of them make the step's peak
    trace, console = _run(tmp_path, model, 256, zero_grad_after_forward=False)
    # where the peak lies, from the rows: after the model's forward returned, before its backward began
    before, end = _peak_window(trace, 0)
    assert before == ("forward", "", "exit") and end[0] == "backward" and end[2] == "enter"
    rows = trace.iterations
    assert rows.peak_phase.tolist() == ["forward"] * STEPS  # summarised and steady iterations alike
    assert rows.peak_module.tolist() == [""] * STEPS
    assert (rows.template_iteration >= 0).any()  # steady ones among them
    assert (rows[CATEGORIES].sum(axis=1) == rows.peak_allocated_bytes).all()
    # what the loss allocated after the forward returned is allocated in the forward phase too
    allocations = trace.read("allocations", iterations=[0])
    loss_made = allocations[(allocations.bytes == 256 * 1024 * 4) & (allocations.category != "feature_maps")]
    assert len(loss_made) and set(loss_made.phase) == {"forward"}
    assert console.count("during forward, after the model's forward returned (the loss)") == STEPS
    assert "previous step's weight gradients" not in console  # zero_grad came first: none were alive


def test_zero_grad_after_the_forward_says_the_previous_gradients_are_alive(tmp_path) -> None:
    model = _mlp(128, 512)
    trace, console = _run(tmp_path, model, 8, zero_grad_after_forward=True, detail_first=2)
    weights = _weight_bytes(model)
    assert weights == (32 * 128 + 128 + 128 * 512 + 512) * 4
    before, end = _peak_window(trace, 1)  # (the first step had no gradients before it)
    assert before == ("forward", "", "exit") and end[:1] == ("backward",)
    later = trace.iterations[trace.iterations.iteration >= 1]
    assert (later.peak_phase == "forward").all() and (later.peak_module == "").all()
    assert later.weight_grads.tolist() == [weights] * (STEPS - 1)  # the previous step's, still alive
    line = f"previous step's weight gradients alive at the peak: {format_bytes(weights)} (zero_grad runs after"
    assert console.count(line) == STEPS - 1


@pytest.mark.parametrize("zero_grad_after_forward", [False, True])
def test_large_weights_peak_in_backward_unless_the_previous_gradients_are_alive(tmp_path, zero_grad_after_forward: bool) -> None:
    model = _mlp(512, 16)  # large weights, small logits: the new gradients make the peak, in backward
    trace, console = _run(tmp_path, model, 4, zero_grad_after_forward)
    rows = trace.iterations.set_index("iteration")
    if zero_grad_after_forward:  # the previous step's gradients alive at the forward's end lift it there
        assert rows.peak_phase[1] == "forward" and "previous step's weight gradients alive" in console
    else:
        assert set(rows.peak_phase) == {"backward"} and "after the model's forward" not in console
        assert "previous step's weight gradients" not in console
