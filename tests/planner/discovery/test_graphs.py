"""General graphs: a U-Net, an encoder-decoder transformer and blocks with parallel branches, planned as one
chain of stages with the tensors that cross stages carried (planner.discovery.graph_finder, planner.solvers.carried_fit).

For each model: the chain covers its blocks, schedules are applied in place with gradients bitwise those of
plain autograd, and the whole step's peak measured with the allocator is in the prediction's band
(tests/planner/prediction_band.py).
The user's named checkpoints and the error for a graph that cannot be segmented are tested too.
"""

from __future__ import annotations

import copy

import pytest
import torch

from memprof import MemoryProfiler, load_trace
from planner import (
    Chain,
    NotAChainError,
    apply_schedule,
    chain_from_trace,
    min_feasible_budget,
    pareto_front,
    solve,
    store_all_budget,
)
from planner.executor import remove_schedule
from planner.solvers.carried_fit import Carried
from tests.planner.discovery.test_real_models import _grads, _train, allocator_step_peak
from tests.planner.graph_models import GRAPH_BUILDERS
from tests.planner.prediction_band import assert_near_prediction

pytestmark = pytest.mark.slow

BATCH = 2
ENCODER_DECODER = [*(f"transformer.encoder.layers.{i}" for i in range(3)), "transformer.encoder.norm",
                   *(f"transformer.decoder.layers.{i}" for i in range(3)), "transformer.decoder.norm"]


def _profile(name: str, out_dir) -> tuple:
    torch.manual_seed(0)
    real = GRAPH_BUILDERS[name]()
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    with MemoryProfiler(real.model, optimizer, out_dir=out_dir, print_period=0, background=False) as profiler:
        for _ in range(3):
            batch = real.make_batch(BATCH)
            _train(real, real.model, optimizer, batch)
            profiler.record_stats()
    return real, load_trace(profiler.run_dir), optimizer, batch


@pytest.fixture(scope="module", params=sorted(GRAPH_BUILDERS))
def profiled(request, tmp_path_factory):
    return _profile(request.param, tmp_path_factory.mktemp(request.param))


def _stage_modules(chain: Chain) -> list[str]:
    return [m for stage in chain.stages[:-1] for m in stage.modules]


def test_the_chain_covers_the_graph(profiled) -> None:
    real, trace, _, _ = profiled
    chain = chain_from_trace(trace)
    found = _stage_modules(chain)
    assert [m for m in found if m in real.blocks] == [m for m in real.blocks if m in found]
    if real.name == "unet":
        assert found == list(real.blocks)
        # each skip: made by an encoder stage, read by the decoder stage at its level, live across the cuts between
        assert [(c.name, c.producer, c.consumers) for c in chain.carried] == [
            ("inc", 1, (7,)), ("down1", 2, (6,)), ("down2", 3, (5,))]
        assert all(c.size_bytes > 0 for c in chain.carried)
    elif real.name == "seq2seq":
        assert set(real.blocks) <= set(found)  # encoder and decoder blocks in one chain
        memory = [c for c in chain.carried if c.producer > 0]
        assert len(memory) == 1 and memory[0].consumers == tuple(range(memory[0].producer + 2, chain.length))
        assert any(c.producer == 0 and c.name == "tgt_embed" for c in chain.carried)  # made before the chain
    else:
        assert found == ["stem", *real.blocks, "head"] and chain.carried == ()  # each two-branch block is whole
    assert Chain.from_json(chain.to_json()).carried == chain.carried


def _check(real, chain: Chain, optimizer, batch, budget: int, algorithm: str = "rotor") -> tuple[int, int]:
    schedule = solve(chain, budget, algorithm)
    assert schedule.predicted_step_peak_bytes <= budget
    return _check_schedule(real, schedule, optimizer, batch)


def _check_schedule(real, schedule, optimizer, batch) -> tuple[int, int]:
    model = real.model
    ref_loss, ref_grads = _grads(real, copy.deepcopy(model), batch)
    apply_schedule(model, schedule)
    try:
        loss, grads = _grads(real, model, batch)
        assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
        assert all(torch.equal(grads[name], ref_grads[name]) for name in grads)
        measured = allocator_step_peak(real, model, optimizer, batch)
    finally:
        remove_schedule(model)
    predicted = schedule.predicted_step_peak_bytes
    assert_near_prediction(measured, predicted, real.name, schedule.algorithm)
    return predicted, measured


@pytest.mark.parametrize("where", ["store_all", "minimum", "between"])
def test_schedules_give_plain_gradients_and_the_predicted_step_peak(profiled, where: str) -> None:
    real, trace, optimizer, batch = profiled
    chain = chain_from_trace(trace)
    low, high = min_feasible_budget(chain), store_all_budget(chain)
    assert low < high
    budget = {"store_all": high, "minimum": low, "between": (low + high) // 2}[where]
    _check(real, chain, optimizer, batch, budget, "store_all" if where == "store_all" else "rotor")


def test_the_front_counts_the_skips_and_its_schedules_peak_as_predicted(profiled) -> None:
    real, trace, optimizer, batch = profiled
    chain = chain_from_trace(trace)
    front = pareto_front(chain)
    assert front.max_budget_bytes == store_all_budget(chain)
    assert bool(front.plans) == bool(chain.carried)
    budgets = [int(b) for b in front.budgets_bytes]
    for budget in budgets:
        assert front.schedule_at(budget).predicted_step_peak_bytes <= budget
    _check_schedule(real, front.schedule_at(budgets[len(budgets) // 3]), optimizer, batch)


def test_named_checkpoints_plan_the_encoder_decoder_block_by_block(tmp_path) -> None:
    real, trace, optimizer, batch = _profile("seq2seq", tmp_path)
    chain = chain_from_trace(trace, checkpoints=ENCODER_DECODER)
    assert _stage_modules(chain) == ENCODER_DECODER and chain.source["auto"] is False
    assert min_feasible_budget(chain) < min_feasible_budget(chain_from_trace(trace))  # finer than the fused stages
    _check(real, chain, optimizer, batch, min_feasible_budget(chain))


def test_checkpoints_that_do_not_cut_the_graph_are_refused(tmp_path) -> None:
    _, trace, _, _ = _profile("unet", tmp_path)
    with pytest.raises(NotAChainError, match=r"'up3' does not cut the graph after 'down1': it does not read "
                                             r"'down1''s output; it reads the output of 'inc', 'up2';"):
        chain_from_trace(trace, checkpoints=["inc", "down1", "up3", "outc"])
    with pytest.raises(NotAChainError, match="'nope' is not a module that ran"):
        chain_from_trace(trace, checkpoints=["inc", "nope"])
    with pytest.raises(NotAChainError, match="lies inside checkpoint 'down1'"):
        chain_from_trace(trace, checkpoints=["down1", "down1.maxpool_conv"])


def test_a_link_through_a_module_run_twice_is_named(tmp_path) -> None:
    """T5 as one chain: the decoder's first block reads the decoder's embedding through the stack's dropout,
    which each stack runs twice (on its embeddings and on its output), so no checkpoint can lie between."""
    from tests.planner.real_models import t5

    real = t5()
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    with MemoryProfiler(real.model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            _train(real, real.model, optimizer, real.make_batch(BATCH))
            profiler.record_stats()
    names = [*(f"encoder.block.{i}" for i in range(3)), "encoder.final_layer_norm", "decoder.block.0"]
    with pytest.raises(NotAChainError, match=r"'decoder.block.0' does not cut the graph after "
                                             r"'encoder.final_layer_norm'.*'decoder.dropout' \(run 2 times per "
                                             r"step: it cannot be a checkpoint, nor lie inside one\)"):
        chain_from_trace(load_trace(profiler.run_dir), checkpoints=names)


def test_parallel_branches_cannot_be_segmented_and_say_why(tmp_path) -> None:
    _, trace, _, _ = _profile("branches", tmp_path)
    with pytest.raises(NotAChainError, match=r"'blocks.0.right.0' does not read the output of 'blocks.0.left.1' "
                                             r"\(parallel branches\)"):
        chain_from_trace(trace, container="blocks.0")


def test_a_skip_counts_only_where_the_chain_has_dropped_it() -> None:
    from planner.model.chain import Stage
    from planner.model.schedule import Op, OpKind
    from planner.simulation.carried_memory import extra_bytes
    from planner.simulation.simulator import simulate

    stages = tuple(Stage(1.0, 1.0, 100, 150, 100, name=f"s{i}") for i in range(4)) + (Stage(0.0, 0.0, 0, 0, 0),)
    chain = Chain("toy", 100, stages, carried=(Carried(1, (4,), 100, "s0"),))
    F = lambda kind, s: Op(OpKind(kind), s)  # noqa: E731
    keep = [F("F_all", s) for s in range(1, 6)] + [Op(OpKind.B, s) for s in range(5, 0, -1)]
    extra = extra_bytes(chain, simulate(chain, keep).timeline)
    # store-all keeps a^1 inside a-bar^1 until B(1): only the skip's gradient counts, from B(4) to B(2)
    assert extra == [0] * 7 + [100, 100, 0]
    # F_none(2) drops a^1 while stage 4 still needs it: the skip counts from there to B(4), then its gradient
    drop = [F("F_ck", 1), F("F_none", 2), F("F_all", 3), F("F_all", 4), F("F_all", 5), Op(OpKind.B, 5),
            Op(OpKind.B, 4), Op(OpKind.B, 3), F("F_ck", 1), F("F_all", 2), Op(OpKind.B, 2), F("F_all", 1),
            Op(OpKind.B, 1)]
    assert extra_bytes(chain, simulate(chain, drop).timeline) == [0, 0] + [100] * 9 + [0, 0]


def test_plan_command_takes_checkpoints(tmp_path, capsys) -> None:
    from cli.main import main
    from planner.model.schedule import Schedule

    _, trace, _, _ = _profile("unet", tmp_path / "run")
    out = tmp_path / "schedule.json"
    names = "inc,down1,down2,down3,up1,up2,up3,outc"
    budget = min_feasible_budget(chain_from_trace(trace, checkpoints=names.split(",")))
    assert main(["plan", str(trace.path), "--budget", str(budget), "--checkpoints", names, "--out", str(out)]) == 0
    schedule = Schedule.from_json(out)
    assert len(schedule.chain.carried) == 3 and schedule.predicted_step_peak_bytes <= budget
    assert main(["plan", str(trace.path), "--budget", str(budget), "--checkpoints", "inc,up3",
                 "--out", str(out)]) == 2
    assert "do not cut the graph: 'down1' reads the output of 'inc'" in capsys.readouterr().err
