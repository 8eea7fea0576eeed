"""Recomputation options generated from op records: a hand-built transformer block, every byte and ms by hand."""

from __future__ import annotations

import random
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
    # ranking by FLOPs per byte (never by the recorded times): 10 (40), 4 (20), then 10 each: 1, 5, 8 (by
    # position); 2 (5); then the ops without FLOPs by position: 0, 3, 6, 7, 9. Byte cuts at 625, 1250 and 1875 of
    # the 2500 bytes: 10, 4, 1, 5 (600); 10 .. 8 (1000); 10 .. 2, 0 (1500). FLOPs cuts sparing at least 4000,
    # 8000, 12000 and 14400 of the 16000: 10; 10, 4, 1 (9000); 10 .. 8 (14000: the 1/2 bytes cut); 10 .. 2
    # (the "compute" set, 16000). 10 .. 2, 0 replays no fewer FLOPs (0) than "compute" for more bytes: dropped.
    assert found == [
        ("compute", 1500, (1, 2, 4, 5, 8, 10)),  # every op with FLOPs, needed by a backward or not
        ("keep addmm*4,bmm", 1100, (1, 4, 5, 8, 10)),  # 1/2 of the bytes, 3/4 of the FLOPs
        ("keep addmm*3,bmm", 700, (1, 4, 5, 10)),  # 1/4 of the bytes
        ("keep addmm*2,bmm", 600, (1, 4, 10)),  # 1/2 of the FLOPs
        ("keep addmm", 200, (10,)),  # 1/4 of the FLOPs
        ("none", 100, ()),
    ]
    # priced by the recorded times: 7.6 ms less what each keeps (6.3, 5.5, 3.9, 3.4, 1.6 ms)
    times = [o.recompute_ms for o in options]
    assert times == pytest.approx([7.6 - 6.3, 7.6 - 5.5, 7.6 - 3.9, 7.6 - 3.4, 7.6 - 1.6, 7.6])
    assert options[0].save_ops == ("aten.addmm.default", "aten.bmm.default", "aten.bmm.default",
                                   "aten.addmm.default", "aten.addmm.default", "aten.addmm.default")
    assert options[0].recompute_flops == 0
    assert options[-1].recompute_flops == 16000


@pytest.mark.parametrize("seed", range(5))
def test_the_recorded_times_price_the_options_but_never_choose_them(seed: int) -> None:
    """A planning pass on a busy machine records each op several times slower or faster: the options (what each
    keeps, in which order) are the same, selective and partial alike; only their recomputation times follow."""
    rng = random.Random(seed)
    timed = tuple(replace(r, forward_ms=r.forward_ms * rng.uniform(0.3, 3.0)) for r in RECORDS)
    stage = replace(STAGE, forward_ms=STAGE.forward_ms * rng.uniform(0.3, 3.0))
    for records, plain in ((timed, RECORDS), (_with_reads(timed), _with_reads(RECORDS))):
        options, reference = stage_options(records, stage), stage_options(plain, STAGE)
        assert [(o.name, o.saved_bytes, o.saves, o.recompute_flops, o.partial) for o in options] == \
            [(o.name, o.saved_bytes, o.saves, o.recompute_flops, o.partial) for o in reference]
    total_ms = sum(r.forward_ms for r in timed)
    for option in stage_options(timed, stage):  # each replays every op it does not keep: its share of the times
        replayed_ms = sum(r.forward_ms for p, r in enumerate(timed) if p not in option.saves)
        assert option.recompute_ms == pytest.approx(stage.forward_ms * replayed_ms / total_ms)


def _with_reads(records: tuple[OpRecord, ...]) -> tuple[OpRecord, ...]:
    """The block's records as a planning pass writes them now, with what each op reads (the op before it and
    what its backward needs) and writes (nothing in place): its options are then partial."""
    return tuple(replace(r, reads=tuple(sorted({*r.needs, r.index - 1} - {r.index})) if p else (), writes=())
                 for p, r in enumerate(records))


def test_recompute_time_is_scaled_to_the_stages_forward() -> None:
    """The op times sum to 7.6 ms; a module time of 15.2 ms doubles every recomputation."""
    options = stage_options(RECORDS, Stage(15.2, 30.0, 100, 2000, 100))
    assert [o.recompute_ms for o in options] == pytest.approx([2.6, 4.2, 7.4, 8.4, 12.0, 15.2])


def test_without_times_flops_weigh_the_recomputation() -> None:
    untimed = tuple(OpRecord(index=r.index, module=r.module, op=r.op, output_bytes=r.output_bytes, needs=r.needs,
                             flops=r.flops) for r in RECORDS)
    options = stage_options(untimed, STAGE)
    assert {o.name for o in options} >= {"compute", "none"}
    for option in options:  # each option recomputes its share of the 16000 FLOPs of the forward's 7.6 ms
        assert option.recompute_ms == pytest.approx(7.6 * option.recompute_flops / 16000)


def test_kept_bytes_are_clamped_and_dominated_options_dropped() -> None:
    """With a-bar = 600 every option keeping 600 bytes or more replays FLOPs for nothing: dropped."""
    options = stage_options(RECORDS, Stage(7.6, 15.0, 100, 600, 100))
    assert [(o.name, o.saved_bytes) for o in options] == [("keep addmm", 200), ("none", 100)]


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
