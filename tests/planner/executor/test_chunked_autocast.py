"""The chunked loss under autocast (bfloat16 on CPU): loss and gradients of a scheduled model against plain
autograd under the same autocast.

Oracle: the same model without a schedule, trained under ``torch.autocast("cpu", dtype=torch.bfloat16)``.
Tolerance (docs/planner.md, "The loss stage's options"): the head's products run in bfloat16 in both, on the
same bfloat16 operands, so each chunk's logits and gradients are plain autograd's rows; the head's weight
(and bias) gradient sums the chunks' products in float32 and is then rounded once to bfloat16, as plain
autograd's one product over every token rounds it. What differs is the order of float32 sums (the loss over
chunks: ``rtol=1e-5``, measured 7.6e-8; the weight gradient over chunks of tokens), which can move a value
sitting at a bfloat16 rounding boundary by one rounding: every gradient is held to one bfloat16 rounding
(``2**-8`` relative, and of its tensor's largest element), and the largest difference over all of them to
``2**-10`` of its tensor's largest element (measured: 7e-11 on GPT-2, whose tied embedding sums two float32
terms, 0 on Llama; a head gradient summed in float32 and not rounded as plain autocast rounds it, as before
this test, differed by 2.2e-3 and 2.7e-3, about one bfloat16 rounding), far below what autocast itself
moves them from float32 (1e-2 and 1.7e-2).
"""

from __future__ import annotations

import copy

import pytest
import torch

from memprof import MemoryProfiler, load_trace
from planner import apply_schedule, chain_from_trace, min_feasible_budget, solve
from planner.executor import remove_schedule
from planner.executor.apply import loss_chunks
from planner.executor.chunked_head import DeferredLogits
from planner.model.schedule import Op, OpKind, Schedule
from tests.planner import real_models as R

pytestmark = pytest.mark.slow  # profiles two models under autocast (a few seconds each)

BATCH = 4
ROUNDING = 2.0**-8  # one bfloat16 rounding (8 significant bits): see the module's docstring


def _step(model: torch.nn.Module, real: R.RealModel, batch: tuple, autocast: bool = True) -> tuple:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=batch[0], labels=batch[1])
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads, isinstance(out.logits, DeferredLogits)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def profiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    real = R.gpt2(dropout=0.0) if request.param == "gpt2" else R.llama()  # GPT-2's head is tied, Llama's not
    optimizer = torch.optim.SGD(real.model.parameters(), lr=0.0)
    batch = real.make_batch(BATCH)
    batch[1][0, :5] = -100  # a prompt whose tokens are not predicted
    with MemoryProfiler(real.model, optimizer, out_dir=tmp_path_factory.mktemp("autocast"), print_period=0,
                        background=False) as profiler:
        for _ in range(3):
            _step(real.model, real, batch)
            optimizer.step()
            profiler.record_stats()
    return real, batch, chain_from_trace(load_trace(profiler.run_dir))


def _with_loss_option(schedule: Schedule, eager: bool) -> Schedule:
    """``schedule`` whose loss runs in 4 chunks, recomputing or eager (the blocks' operations unchanged)."""
    chain, top = schedule.chain, schedule.chain.length + 1
    option = next(k for k, o in enumerate(chain.stages[-1].options, start=1) if o.chunks == 4 and o.eager == eager)
    ops = tuple(Op(OpKind.F_ALL, top, option) if op.kind is OpKind.F_ALL and op.stage == top else op
                for op in schedule.ops)
    return Schedule(schedule.algorithm, None, ops, chain)


def _largest_difference(found: dict, expected: dict) -> float:
    """The largest difference over every gradient, relative to each tensor's largest element."""
    return max(float((found[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in expected.items())


@pytest.mark.parametrize("eager", [False, True])
def test_a_scheduled_chunked_loss_under_autocast_matches_plain_autocast(profiled, eager: bool) -> None:  # noqa: ANN001
    real, batch, chain = profiled
    assert chain.stages[-1].options, "the trace offers no loss option"
    lowest = solve(chain, min_feasible_budget(chain, "selective"), "selective")  # blocks checkpointed too
    schedule = _with_loss_option(lowest, eager)
    assert loss_chunks(schedule) == (4, eager)
    reference = copy.deepcopy(real.model)
    expected, in_float32 = _step(reference, real, batch), _step(reference, real, batch, autocast=False)
    apply_schedule(real.model, schedule)
    try:
        found = _step(real.model, real, batch)
    finally:
        remove_schedule(real.model)
    assert found[2] and not expected[2]  # the chunked loss ran, and only there
    assert found[0].dtype == expected[0].dtype == torch.float32
    torch.testing.assert_close(found[0], expected[0], rtol=1e-5, atol=0.0)
    assert found[1].keys() == expected[1].keys()
    for name, want in expected[1].items():
        got = found[1][name]
        assert got.dtype == want.dtype == torch.float32, name
        torch.testing.assert_close(got, want, rtol=ROUNDING, atol=ROUNDING * float(want.abs().max()), msg=name)
    worst = _largest_difference(found[1], expected[1])
    assert worst < 2.0**-10, worst  # rounded as plain autocast rounds: a float32 head gradient would be ~2**-9
    assert worst < 0.1 * _largest_difference(in_float32[1], expected[1])  # far below what bfloat16 itself moves
