"""A schedule's stages at either end that run as plain autograd does, and the program of the stages between.

By hand on small programs; on every textbook schedule and random ones, that the program between is valid and that
compiled stages (``aot_eager``: the same aten ops, so bitwise) give plain autograd's step with the plain ends
inlined into the model's compiled graph.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from planner.executor import apply_schedule, remove_schedule
from planner.executor.install import ScheduleExecutor, _PlainForward, _StageForward
from planner.executor.program import Program, plain_ends, trimmed_ops
from tests.planner import models as M
from tests.planner.executor.helpers import SCHEDULES, assert_same_step, chain_for, run_step

_CKPT = [("F_all", 1), ("F_ck", 2), ("F_all", 3), ("F_all", 4), ("F_all", 5), ("B", 5), ("B", 4), ("B", 3),
         ("F_all", 2), ("B", 2), ("B", 1)]


def _middle(n: int) -> list[M.Op]:
    """Stage 2 checkpointed, the others plain: a head of 1 and a tail of n - 2."""
    kinds = [("F_all", 1), ("F_ck", 2), *[("F_all", s) for s in range(3, n + 2)], *[("B", s) for s in range(n + 1, 2, -1)],
             ("F_all", 2), ("B", 2), ("B", 1)]
    return [M.Op(M.OpKind(k), s) for k, s in kinds]


def _pairs(ops) -> list[tuple[str, int]]:
    return [(op.kind.value, op.stage) for op in ops]


def test_the_plain_ends_of_a_checkpointed_middle_and_the_program_between() -> None:
    assert plain_ends(Program(_CKPT, 4)) == (1, 2)
    assert trimmed_ops(_CKPT, 4, 1, 2) == [("F_ck", 1), ("F_all", 2), ("B", 2), ("F_all", 1), ("B", 1)]


def test_store_all_is_plain_throughout_and_leaves_an_empty_program() -> None:
    ops = _pairs(M.store_all(3))
    assert plain_ends(Program(ops, 3)) == (3, 0)
    between = Program(trimmed_ops(ops, 3, 3, 0), 0)
    assert between.length == 0 and between.segments == {}


def test_a_stage_recomputed_or_offloaded_is_not_plain() -> None:
    # stage 1 is run F_all in the forward but recomputed in stage 2's segment: not plain
    ops = [("F_all", 1), ("F_ck", 2), ("F_all", 3), ("B", 3), ("F_all", 1), ("F_all", 2), ("B", 2), ("B", 1)]
    assert plain_ends(Program(ops, 2)) == (0, 0)
    offload = [("F_all", 1), ("OFFLOAD", 1), ("F_all", 2), ("F_all", 3), ("B", 3), ("B", 2), ("PREFETCH", 1),
               ("B", 1)]
    assert plain_ends(Program(offload, 2)) == (0, 1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SCHEDULES)))
def test_the_program_between_the_plain_ends_is_always_valid(n: int, seed: int, name: str) -> None:
    random.seed(seed)
    ops = _pairs(SCHEDULES[name](n))
    head, tail = plain_ends(Program(ops, n))
    assert 0 <= head + tail <= n
    between = Program(trimmed_ops(ops, n, head, tail), n - head - tail)
    # the stages between run exactly the operations they ran in the whole program
    assert sum(1 for k, s in ops if 0 < s - head <= n - head - tail) == \
        sum(1 for k, s in trimmed_ops(ops, n, head, tail) if s <= n - head - tail)
    assert between.length == n - head - tail


@pytest.mark.parametrize("name", ["store_all", "periodic", "revolve", "random", "wasted", "middle"])
def test_compiled_stages_with_plain_ends_give_plain_autograds_step_bitwise(name: str) -> None:
    torch._dynamo.reset()
    model = M.mlp(width=6, depth=5)
    x = torch.randn(4, 6)
    loss = lambda out: out.pow(2).sum()  # noqa: E731
    reference = run_step(model, x, loss)
    chain = chain_for(model)
    ops = _middle(chain.length) if name == "middle" else SCHEDULES[name](chain.length)
    schedule = M.schedule(ops, chain)
    scheduled = copy.deepcopy(model)
    apply_schedule(scheduled, schedule, compile="aot_eager")
    head, tail = plain_ends(Program(_pairs(ops), chain.length))
    assert name != "middle" or (head, tail) == (1, chain.length - 2)
    children = list(scheduled)
    plain = [*children[:head], *children[len(children) - tail:]]
    assert all(isinstance(m.__dict__["forward"], _PlainForward) for m in plain)
    assert all(isinstance(m.__dict__["forward"], _StageForward) for m in children if m not in plain)
    assert_same_step(reference, run_step(torch.compile(scheduled, backend="aot_eager"), x, loss))
    assert_same_step(reference, run_step(scheduled, x, loss))  # and called eagerly
    remove_schedule(scheduled)
    assert not any("forward" in m.__dict__ for m in children)
    torch._dynamo.reset()


def test_eager_stages_keep_every_stage_in_the_executor() -> None:
    stages = [[nn.Linear(2, 2)] for _ in range(3)]
    executor = ScheduleExecutor(stages, _pairs(M.store_all(3)))
    assert executor.plain == [] and executor.program.length == 3
