"""Schedules planned from a compiled model's trace run their stages as compiled regions.

The trace's costing iterations ran each block compiled (memprof.capture.regional), so the chain is the
compiled model's; ``apply_schedule`` then compiles each stage's modules too (``Chain.source["compiled"]``),
whether the model around them is compiled or not. On a Hugging Face GPT-2 under ``torch.compile`` (inductor):
gradients within inductor's own rounding of the compiled model without a schedule, the whole step's peak as
predicted; a schedule whose operations run eagerly only is refused in one line.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from planner import apply_schedule, chain_from_trace, min_feasible_budget, remove_schedule, solve
from planner.errors import InvalidScheduleError
from planner.executor.install import ScheduleExecutor
from tests.allocator_truth import allocator_rise_bytes

_VOCAB, _SEQ, _BATCH = 512, 64, 4


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=_VOCAB, n_positions=64, n_embd=64, n_layer=4, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=_VOCAB - 1,
                        eos_token_id=_VOCAB - 1)
    return GPT2LMHeadModel(config).train()


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _grads(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    _loss(model, ids).backward()
    return {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def compiled_plan(tmp_path_factory):
    model = _gpt2()
    ids = torch.randint(0, _VOCAB, (_BATCH, _SEQ))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    torch._dynamo.reset()  # what earlier tests compiled is not this test's business
    runner = torch.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with MemoryProfiler(runner, optimizer, out_dir=tmp_path_factory.mktemp("compiled"), print_period=0,
                            background=False) as profiler:
            for _ in range(4):
                optimizer.zero_grad(set_to_none=True)
                _loss(runner, ids).backward()
                optimizer.step()
                profiler.record_stats()
    torch._dynamo.reset()
    return model, chain_from_trace(load_trace(profiler.run_dir)), ids


def _step_peak(model: nn.Module, compiled: nn.Module, ids: torch.Tensor) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        _loss(compiled, ids).backward()
        optimizer.step()

    for _ in range(2):  # compiled, warm
        step()
    optimizer.zero_grad(set_to_none=True)
    start = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for t in (*model.parameters(), *model.buffers(), ids)}
    return sum(start.values()) + allocator_rise_bytes(step)


@pytest.mark.slow
def test_a_schedule_from_a_compiled_trace_runs_compiled_exact_to_rounding_and_as_predicted(compiled_plan) -> None:
    model, chain, ids = compiled_plan
    assert chain.source["compiled"] is True
    eager = _grads(copy.deepcopy(model), ids)
    plain = _grads(torch.compile(copy.deepcopy(model)), ids)
    rounding = max((plain[n] - eager[n]).abs().max().item() for n in plain)
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    assert any(op.kind.value == "F_ck" for op in schedule.ops)  # it does recompute
    scheduled = copy.deepcopy(model)
    apply_schedule(scheduled, schedule)
    executor = scheduled._memprof_schedule[0]
    # every stage's modules run their compiled regions
    assert executor.compiled and all(hasattr(f, "_torchdynamo_orig_callable") for s in executor.stages
                                     for f in s.forwards)
    compiled = torch.compile(scheduled)
    grads = _grads(compiled, ids)
    worst = max((grads[n] - plain[n]).abs().max().item() for n in plain)
    assert worst <= max(4 * rounding, 1e-6), (worst, rounding)
    measured = _step_peak(scheduled, compiled, ids)
    predicted = schedule.predicted_step_peak_bytes
    assert predicted is not None
    assert abs(measured - predicted) <= 0.05 * predicted + 64 * 1024, (measured, predicted)
    remove_schedule(scheduled)
    apply_schedule(scheduled, schedule, compile=False)  # eagerly, on request
    assert not scheduled._memprof_schedule[0].compiled
    remove_schedule(scheduled)
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_exported_file_runs_a_compiled_chains_stages_compiled(compiled_plan, tmp_path) -> None:
    from planner.export.files import export_python
    from tests.planner.executor.test_export import _load

    model, chain, ids = compiled_plan
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    exported = _load(tmp_path, export_python(schedule))
    assert exported.COMPILED is True
    scheduled = copy.deepcopy(model)
    exported.apply_schedule(scheduled)
    assert scheduled._memprof_schedule[0].compiled
    exported.apply_schedule(scheduled, compile=False)
    assert not scheduled._memprof_schedule[0].compiled


@pytest.mark.slow
def test_under_regional_compilation_too(compiled_plan) -> None:
    model, chain, ids = compiled_plan
    regional = copy.deepcopy(model)
    for block in regional.transformer.h:
        block.compile()  # PyTorch's regional compilation: each block's call compiled, hooks included
    eager = _grads(copy.deepcopy(model), ids)
    plain = _grads(regional, ids)
    rounding = max((plain[n] - eager[n]).abs().max().item() for n in plain)
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    apply_schedule(regional, schedule)
    assert regional._memprof_schedule[0].compiled
    grads = _grads(regional, ids)
    worst = max((grads[n] - plain[n]).abs().max().item() for n in plain)
    assert worst <= max(4 * rounding, 1e-6), (worst, rounding)
    remove_schedule(regional)
    torch._dynamo.reset()


def _linears() -> list[list[nn.Module]]:
    return [[nn.Linear(4, 4)], [nn.Linear(4, 4)]]


def test_a_selective_option_with_compiled_stages_is_refused_in_one_line() -> None:
    ops = [("F_all[1]", 1), ("F_all", 2), ("F_all", 3), ("B", 3), ("B", 2), ("B", 1)]
    with pytest.raises(ValueError, match="runs eagerly only") as caught:
        ScheduleExecutor(_linears(), ops, policies={(1, 1): [("aten::mm", 0)]}, compiled=True)
    assert "\n" not in str(caught.value) and "compile=False" in str(caught.value)
    ScheduleExecutor(_linears(), ops, policies={(1, 1): [("aten::mm", 0)]})  # eagerly: fine


def test_an_offload_with_compiled_stages_is_refused_in_one_line() -> None:
    ops = [("F_all", 1), ("OFFLOAD", 1), ("F_all", 2), ("F_all", 3), ("B", 3), ("B", 2), ("PREFETCH", 1), ("B", 1)]
    with pytest.raises(ValueError, match="an offload, which runs eagerly only"):
        ScheduleExecutor(_linears(), ops, compiled=True)


def test_apply_schedule_says_invalid_schedule_for_a_refused_combination() -> None:
    from planner.model.schedule import Op, OpKind, Schedule
    from tests.planner import models as M

    a, off, pre, b = OpKind.F_ALL, OpKind.OFFLOAD, OpKind.PREFETCH, OpKind.B
    ops = (Op(a, 1), Op(off, 1), Op(a, 2), Op(a, 3), Op(b, 3), Op(b, 2), Op(pre, 1), Op(b, 1))
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(InvalidScheduleError, match="runs eagerly only"):
        apply_schedule(model, Schedule("h", None, ops, M.chain(2)), compile=True)
    assert "_memprof_schedule" not in model.__dict__


def test_fullgraph_runs_a_schedule_without_recomputation_and_refuses_one_with_it_in_one_line() -> None:
    from planner.model.schedule import Op, OpKind, Schedule
    from tests.planner import models as M

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    chain = M.chain(3, [["0"], ["1"], ["2"]])
    a, ck, b = OpKind.F_ALL, OpKind.F_CK, OpKind.B
    recomputing = (Op(ck, 1), Op(a, 2), Op(a, 3), Op(a, 4), Op(b, 4), Op(b, 3), Op(b, 2), Op(a, 1), Op(b, 1))
    with pytest.raises(InvalidScheduleError, match="fullgraph=True, which allows no graph break") as caught:
        apply_schedule(torch.compile(model, fullgraph=True), Schedule("r", None, recomputing, chain), compile=True)
    assert "\n" not in str(caught.value) and "1 stage(s)" in str(caught.value)
    assert "_memprof_schedule" not in model.__dict__
    # store-all: every stage is a plain end, inlined into the one graph fullgraph asks for
    torch._dynamo.reset()
    expected = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    apply_schedule(compiled, solve(chain, 10**9, "rotor"))
    assert compiled._memprof_schedule[0].modules == []
    got = torch.autograd.grad(compiled(x).sum(), list(model.parameters()))
    assert all(torch.equal(e, g) for e, g in zip(expected, got))
    remove_schedule(compiled)
    torch._dynamo.reset()
