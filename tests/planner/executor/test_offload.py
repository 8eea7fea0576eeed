"""Offloading saved activations in the executor: bitwise gradients, buffers returned and reused, memory freed.

Without CUDA the executor copies host to host through the same code path; the GPU tests are marked.
"""

from __future__ import annotations

import ast
import copy
import random

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from planner.errors import InvalidScheduleError
from planner.executor import CheckpointedSequential, apply_schedule, validate_ops
from planner.executor import offload as executor_offload
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.transfer import TransferCosts
from planner.simulation.simulator import simulate
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget
from planner.solvers.reference.offload import family
from tests.allocator_truth import allocator_rise_bytes
from tests.planner import models as M
from tests.planner import real_models
from tests.planner.executor.helpers import CASES, assert_same_step, run_step

A, OFF, PRE, B = OpKind.F_ALL, OpKind.OFFLOAD, OpKind.PREFETCH, OpKind.B


def offload_all(length: int) -> list[Op]:
    """Every stage offloaded after its forward and prefetched while the stage above runs its backward."""
    ops = [op for s in range(1, length + 1) for op in (Op(A, s), Op(OFF, s))]
    ops += [Op(A, length + 1), Op(B, length + 1), Op(PRE, length)]
    for s in range(length, 0, -1):
        ops += ([Op(PRE, s - 1)] if s > 1 else []) + [Op(B, s)]
    return ops


def wide_chain(names: list[list[str]]) -> Chain:
    """Placeholder costs in which each stage records four times its output and copies are fast: DPs offload."""
    stages = [Stage(1.0, 2.0, 10, 40, 10, modules=tuple(group)) for group in names]
    return Chain("wide", 10, (*stages, Stage(0.0, 0.0, 1, 1, 1)), transfer=TransferCosts(40.0, 40.0, None))


def blocks(depth: int = 4, width: int = 16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                         nn.LayerNorm(width)) for _ in range(depth)])


def _schedules(chain: Chain) -> list[list[Op]]:
    budget = (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2
    planned = solve(chain, budget, "offload")
    assert planned.has_transfers
    return [offload_all(chain.length), list(planned.ops)]


def test_gradients_are_bitwise_with_every_kind_of_offload_schedule() -> None:
    model, x = blocks(), torch.randn(32, 16)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = wide_chain([[str(i)] for i in range(4)])
    family_schedules = [ops for ops in family(chain) if any(op.kind is OFF for op in ops)]
    picked = random.Random(0).sample(family_schedules, 12)
    for ops in _schedules(chain) + picked:
        scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(ops, chain), min_offload_bytes=0)
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_are_bitwise_on_the_executor_models(name: str) -> None:
    model, container, x, loss, prefix = CASES[name]()
    reference = run_step(model, x, loss)
    sub = model.get_submodule(prefix.rstrip(".")) if prefix else model
    chain = wide_chain([[f"{prefix}{n}"] for n, _ in sub.named_children()])
    for ops in _schedules(chain):
        scheduled = apply_schedule(copy.deepcopy(model), M.schedule(ops, chain), min_offload_bytes=0)
        assert_same_step(reference, run_step(scheduled, x, loss))


def test_gradients_are_bitwise_on_a_torchvision_resnet() -> None:
    case = real_models.resnet()
    names = [["conv1"], ["bn1", "relu"], ["maxpool"], *([n] for n in case.blocks[4:-2]), ["avgpool"], ["fc"]]
    chain = wide_chain(names)
    torch.manual_seed(1)
    batch = case.make_batch(4)

    def step(model: nn.Module) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        case.loss(model, batch).backward()
        return [p.grad for p in model.parameters()]

    expected = step(copy.deepcopy(case.model))
    for ops in _schedules(chain):
        model = apply_schedule(copy.deepcopy(case.model), M.schedule(ops, chain), min_offload_bytes=0)
        for found, wanted in zip(step(model), expected):
            assert torch.equal(found, wanted)


def test_every_buffer_comes_back_and_steps_reuse_them() -> None:
    model, x = blocks(), torch.randn(32, 16)
    chain = wide_chain([[str(i)] for i in range(4)])
    scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(offload_all(4), chain), min_offload_bytes=0)
    pool = scheduled._memprof_schedule[0].pool
    run_step(scheduled, x, lambda out: out.sum())
    assert pool.outstanding == 0 and pool.created > 0
    created = pool.created
    for _ in range(3):
        run_step(scheduled, x, lambda out: out.sum())
        assert pool.outstanding == 0
    assert pool.created == created  # no new (pinned, on CUDA) buffer after the first step


def test_the_offloaded_storages_are_freed_and_small_ones_stay(monkeypatch) -> None:
    model, x = blocks(width=32), torch.randn(64, 32)
    chain = wide_chain([[str(i)] for i in range(4)])
    released: list[tuple[StorageWeakRef, int]] = []
    original = executor_offload.Stash.release

    def spy(stash: executor_offload.Stash) -> None:
        released.extend((StorageWeakRef(s.source.untyped_storage()), s.nbytes) for s in stash.moved if s.source is not None)
        original(stash)

    monkeypatch.setattr(executor_offload.Stash, "release", spy)
    for threshold, expected_moved in ((0, 4), (64 * 128 * 4, 4), (64 * 128 * 4 + 1, 0)):
        released.clear()
        scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(offload_all(4), chain),
                                           min_offload_bytes=threshold)
        loss = scheduled(x.requires_grad_()).sum()  # every offload is retired by the end of the forward
        assert len({id(ref) for ref, _ in released}) >= expected_moved
        assert all(ref.expired() for ref, _ in released)  # the device memory is gone, not only our reference
        assert all(nbytes >= threshold for _, nbytes in released)
        loss.backward()


def test_offloading_lowers_the_measured_peak_as_predicted() -> None:
    # Linear, Tanh, Linear: the stage records its output and the tanh's (a-bar = 2a); offloading moves the tanh's.
    saving, predicted_saving, store_all = _offload_saving(torch.device("cpu"))
    assert predicted_saving >= 3 * 512 * 32 * 4
    assert abs(saving - predicted_saving) <= 0.02 * store_all


def test_schedules_the_executor_cannot_run_are_refused() -> None:
    chain = M.chain(2)
    with pytest.raises(InvalidScheduleError, match=r"no transfer can run between F_all\(3\) and B\(3\)"):
        validate_ops([Op(A, 1), Op(OFF, 1), Op(A, 2), Op(A, 3), Op(PRE, 1), Op(B, 3), Op(B, 2), Op(B, 1)], 2,
                     Schedule("h", None, (Op(A, 1), Op(OFF, 1), Op(A, 2), Op(A, 3), Op(PRE, 1), Op(B, 3), Op(B, 2),
                                          Op(B, 1)), chain))


def test_a_stage_modified_in_place_after_saving_cannot_be_offloaded() -> None:
    class Clobber(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(x)  # sigmoid saves its output h
            out = h * 2
            h.add_(1.0)  # plain autograd would raise at backward; the offload refuses to copy the wrong values
            return out

    chain = M.chain(2)
    scheduled = CheckpointedSequential(nn.Sequential(nn.Linear(4, 4), Clobber()), M.schedule(offload_all(2), chain),
                                       min_offload_bytes=0)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        scheduled(torch.randn(3, 4)).sum().backward()


def test_an_exported_offload_schedule_runs_standalone_with_bitwise_gradients(tmp_path) -> None:
    import importlib.util

    from planner.export.files import export_python

    model, x = blocks(), torch.randn(32, 16)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = wide_chain([[str(i)] for i in range(4)])
    for index, ops in enumerate(_schedules(chain)):
        path = tmp_path / f"apply_offload_{index}.py"
        path.write_text(export_python(M.schedule(ops, chain)))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert ["OFFLOAD", 1] in module.OPS
        imported = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        assert not {name for name in imported if name and name.split(".")[0] in ("planner", "memprof")}
        scheduled = module.apply_schedule(copy.deepcopy(model), min_offload_bytes=0)
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))
        assert scheduled._memprof_schedule[0].pool.outstanding == 0


@pytest.mark.gpu
def test_on_cuda_offloads_are_bitwise_pinned_and_free_device_memory() -> None:
    device = torch.device("cuda")
    model, x = blocks(depth=6, width=256).to(device), torch.randn(512, 256, device=device)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = wide_chain([[str(i)] for i in range(6)])
    peaks = {}
    for name, ops in (("store_all", M.store_all(6)), ("offload", offload_all(6))):
        scheduled = CheckpointedSequential(copy.deepcopy(model), M.schedule(ops, chain))
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run_step(scheduled, x, lambda out: out.square().sum())
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated()
        if name == "offload":
            pool = scheduled._memprof_schedule[0].pool
            assert pool.outstanding == 0
            assert all(buffer.is_pinned() for stack in pool.free.values() for buffer, _ in stack)
    assert peaks["offload"] < peaks["store_all"]
    # Against the prediction: the Tanh chain of test_offloading_lowers_the_measured_peak_as_predicted, whose
    # costs are exact. On the CPU the measured saving is the predicted one to the byte (4a = 256 KiB of
    # 1.1 MB); on CUDA the offloaded copies go to pinned host memory the device allocator does not count, and a
    # copy on the side stream may be retired one operation late: one activation a of slack.
    saving, predicted_saving, store_all = _offload_saving(device)
    a = 512 * 32 * 4
    assert predicted_saving >= 3 * a
    assert abs(saving - predicted_saving) <= 0.02 * store_all + a, (saving, predicted_saving)


def _offload_saving(device: torch.device) -> tuple[int, int, int]:
    """On the Tanh chain with exact costs: (measured saving of offloading every stage, predicted saving,
    predicted store-all peak), on ``device``."""
    torch.manual_seed(0)
    batch, width, depth = 512, 32, 6
    a = batch * width * 4
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
                            for _ in range(depth)]).to(device)
    stages = [Stage(1.0, 2.0, a, 2 * a, a, a, 2 * a + 8 * width * (width + 1), modules=(str(i),)) for i in range(depth)]
    chain = Chain("tanh", a, (*stages, Stage(0.5, 0.5, 4, 4, 4, a, 0)))
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)
    measured, predicted = {}, {}
    for name, ops in (("store_all", M.store_all(depth)), ("offload", offload_all(depth))):
        schedule = M.schedule(ops, chain)
        scheduled = CheckpointedSequential(copy.deepcopy(model), schedule, min_offload_bytes=0)
        (scheduled(x) * target).sum().backward()  # the .grad tensors and the pool's buffers, outside the peak
        scheduled.zero_grad(set_to_none=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            (scheduled(x) * target).sum().backward()
            torch.cuda.synchronize()
            measured[name] = torch.cuda.max_memory_allocated() - base
        else:
            measured[name] = allocator_rise_bytes(lambda net=scheduled: (net(x) * target).sum().backward())
        predicted[name] = simulate(chain, schedule).peak_bytes
    return (measured["store_all"] - measured["offload"], predicted["store_all"] - predicted["offload"],
            predicted["store_all"])
