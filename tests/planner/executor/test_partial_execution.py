"""Partial options from a planning pass, run by the executor: plain autograd's gradients on an MLP and a GPT-2
with dropout, the forward holds what the options predict (the allocator's counts), the exported file runs them,
and a partial option replays fewer FLOPs than the same kept outputs replayed whole."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from memprof import load_trace
from planner import solve, solve_held, store_all_budget
from planner.discovery.cone import cone, stage_graph
from planner.discovery.option_builder import ops_of_stage, stage_options
from planner.executor import apply_schedule, remove_schedule
from planner.export.files import export_python
from planner.model.schedule import Op, OpKind, Schedule
from planner.solvers import held
from tests.planner.executor.test_selective_execution import (
    _forward_held_bytes,
    _grads,
    _profiled,
    assert_exported_grads_equal,
    assert_step_peak_as_predicted,
    with_prediction,
)
from tests.planner.real_models import RealModel, _lm_batch, _lm_loss

BATCH = 4


class _Block(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(x))))


def mlp() -> RealModel:
    """Three residual MLP blocks with dropout, then a linear head."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block() for _ in range(3)], nn.Linear(32, 4))
    model.train()
    return RealModel("mlp", model, lambda n: (torch.randn(n, 16, 32), torch.randn(n, 16, 4)),
                     lambda m, batch: F.mse_loss(m(batch[0]), batch[1]), ("0", "1", "2"))


def gpt2() -> RealModel:
    """GPT-2 from the issue's config, random weights, dropout active (eager attention: softmax, then dropout)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False,
                        attn_implementation="eager", bos_token_id=127, eos_token_id=127)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    model.train()
    return RealModel("gpt2", model, _lm_batch(128, 32), _lm_loss, ("transformer.h.0", "transformer.h.1"))


def _with_options(base: Schedule, choose) -> Schedule:  # noqa: ANN001 -- stage -> option
    return with_prediction(Schedule("selective", None, tuple(
        Op(op.kind, op.stage, choose(op.stage) if op.kind is OpKind.F_ALL else 0) for op in base.ops), base.chain))


@pytest.mark.parametrize("build", [mlp, gpt2], ids=["mlp", "gpt2"])
def test_every_partial_option_of_every_block_gives_plain_gradients(build, tmp_path: Path) -> None:  # noqa: ANN001
    real, _, chain = _profiled(build, tmp_path)
    blocks = [index for index in range(1, chain.length + 1) if chain.stage(index).options]
    assert blocks and all(o.partial for index in blocks for o in chain.stage(index).options)
    base = solve(chain, store_all_budget(chain), "store_all")
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    schedules = [_with_options(base, lambda stage, index=index, option=option: option if stage == index else 0)
                 for index in blocks for option in range(1, len(chain.stage(index).options) + 1)]
    schedules.append(_with_options(base, lambda stage: len(chain.stage(stage).options)))  # the least, everywhere
    for schedule in schedules:
        apply_schedule(real.model, schedule)
        try:
            assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True)), str(schedule.ops)
        finally:
            remove_schedule(real.model)


def test_held_budgets_with_partial_options_hold_what_they_predict(tmp_path: Path) -> None:
    """As test_selective_execution.py's held-budget test: the forward holds what the options keep (the
    allocator's bytes), the gradients are plain autograd's, the whole step's peak is in the prediction's band."""
    real, optimizer, chain = _profiled(gpt2, tmp_path)
    batch = real.make_batch(BATCH)
    plain = _grads(real, batch)
    plain_held = _forward_held_bytes(real, batch)
    store_all = held.store_all_held_bytes(chain)
    schedule = solve_held(chain, max(held.min_held_bytes(chain), store_all // 10))
    used = [chain.stage(op.stage).options[op.option - 1] for op in schedule.ops if op.option]
    assert len(used) >= 2 and all(option.partial for option in used)
    apply_schedule(real.model, schedule)
    try:
        assert all(torch.equal(a, b) for a, b in zip(plain, _grads(real, batch), strict=True))
        measured_cut = plain_held - _forward_held_bytes(real, batch)
    finally:
        remove_schedule(real.model)
    predicted_cut = store_all - schedule.params.held_bytes
    assert abs(measured_cut - predicted_cut) <= 0.02 * store_all, (measured_cut, predicted_cut, store_all)
    assert_step_peak_as_predicted(real, optimizer, schedule, tmp_path)


def test_the_exported_file_runs_partial_options(tmp_path: Path) -> None:
    real, _, chain = _profiled(gpt2, tmp_path)
    schedule = solve_held(chain, held.min_held_bytes(chain))
    text = export_python(schedule)
    assert "PARTIAL = [[" in text
    path = tmp_path / "schedule.py"
    path.write_text(text)
    assert_exported_grads_equal(real, path)


def test_keeping_the_softmax_replays_the_dropout_after_it_not_the_matmul_before_it(tmp_path: Path) -> None:
    real, _, chain = _profiled(gpt2, tmp_path)
    trace = load_trace(next(p.parent for p in (tmp_path / "profile").rglob("meta.json")))
    stage = next(s for s in chain.stages if s.modules and s.modules[0] == "transformer.h.0")
    ops = ops_of_stage(trace.op_records(), stage)
    graph = stage_graph(ops)
    softmax = next(p for p, r in enumerate(ops) if r.op == "aten._softmax.default")
    scores = max(p for p in range(softmax) if ops[p].flops > 0)  # the matmul of queries and keys
    output = max(p for p, r in enumerate(ops) if r.output_bytes > 0)
    replayed = cone(graph, {softmax, output})
    dropout = [p for p, r in enumerate(ops) if p > softmax and r.op.startswith("aten.bernoulli_")][0]
    assert dropout in replayed and scores not in replayed and softmax not in replayed
    partial_flops = sum(ops[p].flops for p in replayed)
    whole_flops = sum(r.flops for p, r in enumerate(ops) if p != softmax)  # a selective option replays the rest
    assert partial_flops == whole_flops - ops[scores].flops < whole_flops
    # every partial option of the block against the same kept outputs replayed whole (a trace without reads);
    # ranked by FLOPs (never by the recorded times), no option keeps the softmax's output without the matmul
    # before it: what a partial option spares over a selective one keeping the same outputs is elementwise ops
    partial = stage_options(ops, stage)
    for option in partial:
        assert option.partial
        kept = set(option.saves) | {output}
        assert option.recompute_flops == sum(ops[p].flops for p in cone(graph, kept))
        assert option.recompute_flops <= sum(r.flops for p, r in enumerate(ops) if p not in option.saves)
    assert any(len(cone(graph, set(o.saves) | {output})) < len(ops) - len(o.saves) for o in partial)
    whole = stage_options([replace(r, reads=None) for r in ops], stage)
    assert whole and not any(o.partial for o in whole)
