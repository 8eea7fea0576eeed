"""Recomputation options generated from op records: a hand-built transformer block, every byte and ms by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memprof.analysis.op_records import OpRecord
from planner.discovery.option_builder import ops_of_stage, stage_options, with_options
from planner.errors import ChainError
from planner.model.chain import Chain, Stage

# (op, output_bytes, needs, forward_ms, flops), indexes 10.. as in a whole model's records
BLOCK = [
    ("aten.native_layer_norm.default", 100, (10,), 0.2, 0),  # ln1
    ("aten.addmm.default", 300, (10,), 1.0, 3000),  # qkv
    ("aten.bmm.default", 400, (11,), 0.8, 2000),  # scores
    ("aten._softmax.default", 400, (13,), 0.4, 0),
    ("aten.bmm.default", 100, (13, 11), 0.8, 2000),  # attention
    ("aten.addmm.default", 100, (14,), 0.5, 1000),  # proj
    ("aten.add.Tensor", 100, (), 0.05, 0),  # residual
    ("aten.native_layer_norm.default", 100, (16,), 0.2, 0),  # ln2
    ("aten.addmm.default", 400, (17,), 1.6, 4000),  # fc1
    ("aten.gelu.default", 400, (18,), 0.3, 0),
    ("aten.addmm.default", 100, (19,), 1.6, 4000),  # fc2
    ("aten.add.Tensor", 100, (), 0.15, 0),  # residual: the block's output
]
RECORDS = tuple(OpRecord(index=10 + i, module="layers.0.attn" if i < 7 else "layers.0.mlp", op=op, output_bytes=size,
                         needs=needs, forward_ms=ms, flops=flops) for i, (op, size, needs, ms, flops) in enumerate(BLOCK))
# candidates (allocating, needed or with FLOPs, not the output): ops 0..10: 2500 bytes; a^l = 100
STAGE = Stage(forward_ms=7.6, backward_ms=15.0, output_bytes=100, saved_bytes=2000, grad_bytes=100,
              modules=("layers.0",))


def test_transformer_block_options() -> None:
    options = stage_options(RECORDS, STAGE)
    found = [(o.name, o.saved_bytes, o.saves) for o in options]
    # ranking by ms per byte: 10 (.016), 4 (.008), 5 (.005), 8 (.004), 1 (.0033), then .002: 2 (FLOPs first),
    # 0, 7; 3 (.001), 9, 6. Byte cuts at 625, 1250 and 1875 of the 2500 bytes; time cuts sparing at least
    # 1.9, 3.8, 5.7 and 6.84 of the 7.6 ms: 10, 4 (2.4 ms); 10, 4, 5, 8 (4.5); the "compute" set (6.3); and
    # 10 .. 3 (7.1 ms, 2000 bytes: no fewer than keeping everything, dropped).
    assert found == [
        ("keep native_layer_norm*2,addmm*4,bmm*2", 1700, (0, 1, 2, 4, 5, 7, 8, 10)),  # 3/4 of the bytes: 1600
        ("compute", 1500, (1, 2, 4, 5, 8, 10)),  # every op with FLOPs, needed by a backward or not; 3/4 of the time
        ("keep addmm*4,bmm", 1100, (1, 4, 5, 8, 10)),  # 1/2 of the bytes: 1000
        ("keep bmm,addmm*3", 800, (4, 5, 8, 10)),  # 1/2 of the time
        ("keep bmm,addmm*2", 400, (4, 5, 10)),  # 1/4 of the bytes: 300
        ("keep bmm,addmm", 300, (4, 10)),  # 1/4 of the time
        ("none", 100, ()),
    ]
    times = [o.recompute_ms for o in options]
    assert times == pytest.approx([7.6 - 6.7, 7.6 - 6.3, 7.6 - 5.5, 7.6 - 4.5, 7.6 - 2.9, 7.6 - 2.4, 7.6])
    assert options[1].save_ops == ("aten.addmm.default", "aten.bmm.default", "aten.bmm.default",
                                   "aten.addmm.default", "aten.addmm.default", "aten.addmm.default")
    assert options[1].recompute_flops == 0
    assert options[-1].recompute_flops == 16000


def test_recompute_time_is_scaled_to_the_stages_forward() -> None:
    """The op times sum to 7.6 ms; a module time of 15.2 ms doubles every recomputation."""
    options = stage_options(RECORDS, Stage(15.2, 30.0, 100, 2000, 100))
    assert [o.recompute_ms for o in options] == pytest.approx([1.8, 2.6, 4.2, 6.2, 9.4, 10.4, 15.2])


def test_without_times_flops_weigh_the_recomputation() -> None:
    untimed = tuple(OpRecord(index=r.index, module=r.module, op=r.op, output_bytes=r.output_bytes, needs=r.needs,
                             flops=r.flops) for r in RECORDS)
    options = stage_options(untimed, STAGE)
    assert {o.name for o in options} >= {"compute", "none"}
    for option in options:  # each option recomputes its share of the 16000 FLOPs of the forward's 7.6 ms
        assert option.recompute_ms == pytest.approx(7.6 * option.recompute_flops / 16000)


def test_kept_bytes_are_clamped_and_dominated_options_dropped() -> None:
    """With a-bar = 600 every option keeping 600 bytes or more costs time for nothing: dropped."""
    options = stage_options(RECORDS, Stage(7.6, 15.0, 100, 600, 100))
    assert [(o.name, o.saved_bytes) for o in options] == [("keep bmm,addmm*2", 400), ("keep bmm,addmm", 300),
                                                             ("none", 100)]


def test_a_stage_without_records_or_candidates() -> None:
    assert stage_options((), STAGE) == ()
    lone = (OpRecord(index=0, module="m", op="aten.relu.default", output_bytes=100, needs=(0,), forward_ms=1.0),)
    assert [(o.name, o.saved_bytes, o.recompute_ms) for o in stage_options(lone, Stage(1.0, 2.0, 100, 100, 100))] == []


def test_with_options_finds_the_records_of_each_stage() -> None:
    loss = Stage(0.1, 0.1, 4, 4, 4)
    chain = Chain("block", 100, (STAGE, loss))
    records = (*RECORDS, OpRecord(index=40, module="head", op="aten.mm.default", output_bytes=4))
    assert ops_of_stage(records, STAGE) == RECORDS
    made = with_options(chain, {1: ops_of_stage(records, STAGE)})
    assert made.stages[0].options == stage_options(RECORDS, STAGE) and made.stages[1].options == ()
    assert Chain.from_json(made.to_json()) == made
    with pytest.raises(ChainError, match="stages 1..2"):
        with_options(chain, {3: RECORDS})


def test_outputs_written_in_place_afterwards_are_never_kept() -> None:
    """Dropout's mask (empty_like, then bernoulli_ and div_ in place) and a convolution followed by relu_:
    a kept output handed back in the recomputation would be written a second time."""
    rows = [("aten.convolution.default", 400, (), 1.0, 5000), ("aten.relu_.default", 0, (1,), 0.1, 0),
            ("aten.empty_like.default", 400, (), 0.01, 0), ("aten.bernoulli_.float", 0, (), 0.3, 0),
            ("aten.div_.Scalar", 0, (), 0.1, 0), ("aten.mul.Tensor", 400, (2,), 0.1, 0),
            ("aten.addmm.default", 100, (5,), 1.0, 4000), ("aten.add.Tensor", 100, (), 0.1, 0)]
    records = tuple(OpRecord(index=i, module="b", op=op, output_bytes=size, needs=needs, forward_ms=ms, flops=flops)
                    for i, (op, size, needs, ms, flops) in enumerate(rows))
    options = stage_options(records, Stage(2.71, 5.0, 100, 1400, 100, modules=("b",)))
    kept = {i for option in options for i in option.saves}
    assert kept and not kept & {0, 2}
    assert ("compute", (6,)) in [(o.name, o.saves) for o in options]


def test_recorded_writes_decide_what_is_kept_and_random_ops_never_are() -> None:
    """A convolution followed by batch norm's counter ``add_`` (it writes ``num_batches_tracked``, not the
    convolution's output) is kept; one that ``relu_`` writes is not; a random op (CUDA's ``native_dropout``,
    one op allocating output and mask) is never kept, so the recomputation replays every draw."""
    rows = [("aten.convolution.default", 400, (), 1.0, 5000, ()), ("aten.add_.Tensor", 0, (), 0.01, 0, ()),
            ("aten.native_batch_norm.default", 400, (0, 2), 0.2, 0, ()), ("aten.relu_.default", 0, (2,), 0.1, 0, (2,)),
            ("aten.native_dropout.default", 800, (4,), 0.3, 0, ()), ("aten.addmm.default", 400, (4,), 1.0, 4000, ()),
            ("aten.add.Tensor", 100, (), 0.1, 0, ())]
    records = tuple(OpRecord(index=i, module="b", op=op, output_bytes=size, needs=needs, forward_ms=ms, flops=flops,
                             writes=writes) for i, (op, size, needs, ms, flops, writes) in enumerate(rows))
    options = stage_options(records, Stage(2.71, 5.0, 100, 2100, 100, modules=("b",)))
    kept = {i for option in options for i in option.saves}
    assert 0 in kept and not kept & {2, 4}
    unknown = tuple(replace(r, writes=None) for r in records)  # an older trace: the adjacent in-place rule
    assert 0 not in {i for option in stage_options(unknown, STAGE) for i in option.saves}


def test_flops_weigh_the_recomputation_when_asked() -> None:
    """By FLOPs, elementwise ops are free to recompute: keeping every matmul output costs no recomputation
    in FLOPs' terms, so "compute" is an option whatever the ops' (overhead-laden) recorded times say."""
    by_time = stage_options(RECORDS, STAGE)
    by_flops = stage_options(RECORDS, STAGE, recompute_cost="flops")
    compute = next(o for o in by_flops if o.name == "compute")
    assert compute.recompute_ms == 0.0 and compute.saves == (1, 2, 4, 5, 8, 10)
    none = next(o for o in by_flops if o.name == "none")
    assert none.recompute_ms == pytest.approx(STAGE.forward_ms)
    assert [o.recompute_ms for o in by_flops] != [o.recompute_ms for o in by_time]
    with pytest.raises(ChainError, match="recompute_cost must be one of"):
        stage_options(RECORDS, STAGE, recompute_cost="joules")


def test_a_selective_checkpoints_overhead_is_paid_on_every_op() -> None:
    """0.05 ms per op on the block's 12 ops: every option costs 0.6 ms more and keeps the same memory; a
    negative, unknown or infinite overhead is refused."""
    plain = stage_options(RECORDS, STAGE)
    paid = stage_options(RECORDS, STAGE, overhead_ms_per_op=0.05)
    assert [o.saved_bytes for o in paid] == [o.saved_bytes for o in plain]
    assert [o.recompute_ms for o in paid] == pytest.approx([o.recompute_ms + 0.6 for o in plain])
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ChainError, match="selective overhead per op"):
            stage_options(RECORDS, STAGE, overhead_ms_per_op=bad)
