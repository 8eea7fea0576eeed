"""Streaming weights in the executor: bitwise gradients, parameters back in place, device copies freed.

Without CUDA the executor copies host to host through the same code path; the GPU test is marked.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from planner.errors import InvalidScheduleError
from planner.executor import CheckpointedSequential, apply_schedule
from planner.executor import weights as executor_weights
from planner.model.chain import Chain
from planner.model.schedule import Op, Schedule
from planner.model.weights import WeightCosts
from planner.simulation.simulator import simulate
from tests.planner import models as M
from tests.planner import real_models
from tests.planner.executor.helpers import assert_same_step, run_step
from tests.planner.executor.test_offload import blocks, offload_all, wide_chain


def weighted(chain: Chain) -> Chain:
    """``chain`` with placeholder weight costs (the executor reads only which stages are streamed)."""
    n = chain.length
    return chain.with_weights(WeightCosts((100,) * n, (100,) * n, (200,) * n))


def streamed(ops: list[Op], chain: Chain, stages: list[int]) -> Schedule:
    return Schedule("handmade", None, tuple(ops), chain, params={"streamed_weights": stages})


SETS = ([1, 2, 3, 4], [2], [1, 3], [4])


@pytest.mark.parametrize("stages", SETS)
@pytest.mark.parametrize("name", ["store_all", "revolve", "offload_all", "random"])
def test_gradients_are_bitwise_and_parameters_stay_in_place(name: str, stages: list[int]) -> None:
    model, x = blocks(), torch.randn(32, 16)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    ops = {"store_all": M.store_all(4), "revolve": M.revolve(4), "offload_all": offload_all(4),
           "random": M.random_persistent(4, __import__("random").Random(3))}[name]
    net = copy.deepcopy(model)
    storages = [p.data.data_ptr() for p in net.parameters()]
    values = [p.detach().clone() for p in net.parameters()]
    scheduled = CheckpointedSequential(net, streamed(ops, chain, stages), min_offload_bytes=0)
    for _ in range(2):  # the second step starts from parameters that went back to the host
        assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))
        assert [p.data.data_ptr() for p in net.parameters()] == storages
        assert all(torch.equal(p, v) for p, v in zip(net.parameters(), values))
    streamer = scheduled._memprof_schedule[0].weights
    assert streamer is not None and not streamer.present and not streamer.leaving and not streamer.keys
    assert streamer.pool.outstanding == 0


def test_gradients_accumulate_into_existing_ones_as_autograd_does() -> None:
    model, x = blocks(), torch.randn(32, 16)
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))

    def two_steps(net: nn.Module) -> list[torch.Tensor]:
        net.zero_grad(set_to_none=False)
        for seed in (0, 1):
            torch.manual_seed(seed)
            net(x).square().sum().backward()
        return [p.grad for p in net.parameters()]

    expected = two_steps(copy.deepcopy(model))
    scheduled = CheckpointedSequential(copy.deepcopy(model), streamed(M.revolve(4), chain, [1, 2, 3, 4]))
    run_step(scheduled, x, lambda out: out.sum())  # gradients exist before the steps below
    found = two_steps(scheduled)
    assert all(torch.equal(a, b) for a, b in zip(found, expected))
    assert scheduled._memprof_schedule[0].weights.pool.outstanding == 0


def test_device_copies_are_freed_after_their_stage(monkeypatch) -> None:
    model, x = blocks(width=32), torch.randn(64, 32)
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    fetched: list[tuple[int, StorageWeakRef]] = []
    alive_at_enter: list[tuple[set[int], list[int]]] = []
    original_fetch, original_enter = executor_weights.WeightStreamer._fetch, executor_weights.WeightStreamer.enter

    def fetch(self: executor_weights.WeightStreamer, stage: int) -> None:
        original_fetch(self, stage)
        fetched.extend((stage, StorageWeakRef(c.untyped_storage())) for c in self.present[stage][0])

    def enter(self: executor_weights.WeightStreamer, stage: int, backward: bool) -> None:
        expected = {stage} | ({self.upcoming[self.index - 1]} if self.index else set())
        alive_at_enter.append((expected, sorted({s for s, ref in fetched if not ref.expired()})))
        original_enter(self, stage, backward)

    monkeypatch.setattr(executor_weights.WeightStreamer, "_fetch", fetch)
    monkeypatch.setattr(executor_weights.WeightStreamer, "enter", enter)
    scheduled = CheckpointedSequential(copy.deepcopy(model), streamed(M.store_all(4), chain, [1, 2, 3, 4]))
    run_step(scheduled, x, lambda out: out.sum())
    # before each computation only its own stage's copies and those of the next streamed run (copied in as
    # the computation before started) are alive: F_all(3)'s recording does not pin stage 1's or 2's copies
    assert len(alive_at_enter) == 8
    for expected, alive in alive_at_enter:
        assert set(alive) <= expected, (expected, alive)
    assert fetched and all(ref.expired() for _, ref in fetched)


def test_gradients_are_bitwise_on_a_hugging_face_llama() -> None:
    case = real_models.llama()
    names = [[n] for n in case.blocks]
    chain = weighted(wide_chain(names))
    torch.manual_seed(1)
    batch = case.make_batch(2)

    def step(model: nn.Module) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        case.loss(model, batch).backward()
        return [p.grad for p in model.parameters()]

    expected = step(copy.deepcopy(case.model))
    for ops, stages in ((M.store_all(4), [1, 2, 3, 4]), (M.revolve(4), [2, 3]), (offload_all(4), [1, 4])):
        model = copy.deepcopy(case.model)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        apply_schedule(model, streamed(ops, chain, stages), min_offload_bytes=0)
        for _ in range(2):
            for found, wanted in zip(step(model), expected):
                assert found is not None and torch.equal(found, wanted)
        assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_an_exported_streaming_schedule_runs_standalone_with_bitwise_gradients(tmp_path) -> None:
    import ast
    import importlib.util

    from planner.export.files import export_python

    model, x = blocks(), torch.randn(32, 16)
    reference = run_step(model, x, lambda out: out.square().sum())
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    path = tmp_path / "apply_streaming.py"
    path.write_text(export_python(streamed(offload_all(4), chain, [1, 3])))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.STREAMED == [1, 3]
    imported = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name and name.split(".")[0] in ("planner", "memprof")}
    scheduled = module.apply_schedule(copy.deepcopy(model), min_offload_bytes=0)
    assert_same_step(reference, run_step(scheduled, x, lambda out: out.square().sum()))
    streamer = scheduled._memprof_schedule[0].weights
    assert sorted(streamer.params) == [1, 3] and streamer.pool.outstanding == 0


def test_the_executor_and_the_simulator_look_ahead_alike() -> None:
    from planner.simulation.weight_streams import next_runs as simulated

    rng = __import__("random").Random(0)
    for _ in range(200):
        sequence = [rng.randint(1, 4) for _ in range(rng.randint(0, 12))]
        streamed_set = {s for s in range(1, 5) if rng.random() < 0.5}
        assert executor_weights.next_runs(sequence, streamed_set) == simulated(sequence, frozenset(streamed_set))


def test_streamed_stages_outside_the_chain_or_without_weight_costs_are_refused() -> None:
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    with pytest.raises(InvalidScheduleError, match=r"streamed stages \[5\] are outside 1..4"):
        CheckpointedSequential(blocks(), streamed(M.store_all(4), chain, [5]))
    with pytest.raises(InvalidScheduleError, match="no weight costs"):
        CheckpointedSequential(blocks(), streamed(M.store_all(4), chain.with_weights(None), [2]))


@pytest.mark.gpu
def test_on_cuda_streamed_weights_are_bitwise_pinned_and_lower_the_peak() -> None:
    device = torch.device("cuda")
    model, x = blocks(depth=6, width=512).to(device), torch.randn(64, 512, device=device)
    reference = run_step(model, x, lambda out: out.square().sum())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = model(x)  # what a forward keeps for the backward (and its output): the activations of any schedule here
    activations = torch.cuda.memory_allocated() - before
    del out
    chain = weighted(wide_chain([[str(i)] for i in range(6)]))
    grown, left = {}, {}
    for name, stages in (("resident", []), ("streamed", [1, 2, 3, 4, 5, 6])):
        net = copy.deepcopy(model)
        scheduled = CheckpointedSequential(net, streamed(M.store_all(6), chain, stages))
        got = run_step(scheduled, x, lambda out: out.square().sum())  # its gradients stay alive: `got` holds them
        for expected, found in zip(reference[1], got[1]):
            assert torch.equal(expected.cpu(), found.cpu())
        if stages:
            assert all(p.device.type == "cpu" and p.is_pinned() for p in net.parameters())
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run_step(scheduled, x, lambda out: out.square().sum())
        torch.cuda.synchronize()
        grown[name] = torch.cuda.max_memory_allocated() - base
        left[name] = torch.cuda.memory_allocated() - base  # the new gradients, where they are kept
        del net, scheduled, got
    # In bytes computed by hand: each block holds P bytes of parameters (two Linears and a LayerNorm). Resident,
    # the step adds the six blocks' gradients (6P) to the device and keeps them. Streamed, the simulator predicts at
    # most `in_flight` of parameters and gradients on the device at once (those of the stage computing and of the
    # one copied ahead: 4P) above the activations, and every gradient ends on the host. A streamer that left
    # one block's parameters or gradients on the device would exceed the bound by P (8.4 MB).
    p_bytes = (512 * 2048 + 2048 + 2048 * 512 + 512 + 2 * 512) * 4
    assert sum(p.numel() * 4 for p in model.parameters()) == 6 * p_bytes
    exact = chain.with_weights(WeightCosts((p_bytes,) * 6, (p_bytes,) * 6, (0,) * 6))
    in_flight = simulate(exact, streamed(M.store_all(6), exact, [1, 2, 3, 4, 5, 6])).peak_bytes
    assert 2 * p_bytes <= in_flight <= 4 * p_bytes + 2**20
    assert 6 * p_bytes <= left["resident"] <= 6 * p_bytes + 2**20, left
    assert abs(left["streamed"]) <= 2**20, left  # parameters and gradients back on the host
    assert 2 * p_bytes <= grown["streamed"] <= in_flight + activations + 2**20, (grown, in_flight, activations)
    assert grown["streamed"] < grown["resident"]


def test_optimizer_state_follows_its_parameters_and_cpu_scalars_stay() -> None:
    """The only other device here is meta: parameters moved there take their state along, CPU step counters stay."""
    params = [nn.Parameter(torch.empty(3, device="meta")), nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.Adam(params)
    for param in params:  # as Adam's first step leaves it, made while both were on the CPU
        optimizer.state[param] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(param.shape),
                                  "exp_avg_sq": torch.zeros(param.shape)}
    assert executor_weights.state_follows_parameters(optimizer) == 2  # exp_avg and exp_avg_sq of the first
    first, second = optimizer.state[params[0]], optimizer.state[params[1]]
    assert first["exp_avg"].is_meta and first["exp_avg_sq"].is_meta and first["step"].device.type == "cpu"
    assert all(v.device.type == "cpu" for v in second.values())
    assert executor_weights.state_follows_parameters(optimizer) == 0


def test_apply_schedule_hooks_the_optimizer_only_while_weights_stream() -> None:
    model = blocks()
    optimizer = torch.optim.Adam(model.parameters())
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    apply_schedule(model, streamed(M.store_all(4), chain, [2]), container="", optimizer=optimizer)
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    apply_schedule(model, streamed(M.store_all(4), chain, [2]), container="", optimizer=optimizer)
    assert len(optimizer._optimizer_step_pre_hooks) == 1  # the schedule it replaces took its hook along
    model(torch.randn(8, 16)).square().sum().backward()
    optimizer.step()
    from planner.executor import remove_schedule
    remove_schedule(model)
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    apply_schedule(model, streamed(M.store_all(4), chain, []), container="", optimizer=optimizer)
    assert len(optimizer._optimizer_step_pre_hooks) == 0  # nothing streams: nothing to follow
    remove_schedule(model)


@pytest.mark.gpu
def test_on_cuda_an_optimizer_with_state_on_the_device_steps_streamed_weights() -> None:
    """Adam (foreach) stepped on the device, then a streaming schedule applied with it: the state follows the
    parameters to the host and back on remove_schedule, and the parameters match plain training's."""
    from planner.executor import remove_schedule

    device = torch.device("cuda")
    model, x = blocks(depth=4, width=64).to(device), torch.randn(32, 64, device=device)
    plain = copy.deepcopy(model)
    chain = weighted(wide_chain([[str(i)] for i in range(4)]))
    optimizers = [torch.optim.Adam(m.parameters(), foreach=True) for m in (model, plain)]
    for step in range(3):
        for index, (net, opt) in enumerate(zip((model, plain), optimizers)):
            if index == 0 and step == 1:
                apply_schedule(net, streamed(M.store_all(4), chain, [1, 3]), container="", optimizer=opt)
            opt.zero_grad(set_to_none=True)
            net(x).square().sum().backward()
            opt.step()
    streamed_param = next(model[0].parameters())
    assert streamed_param.device.type == "cpu" and optimizers[0].state[streamed_param]["exp_avg"].device.type == "cpu"
    remove_schedule(model)
    assert optimizers[0].state[streamed_param]["exp_avg"].is_cuda and streamed_param.is_cuda
    for mine, theirs in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(mine, theirs)


def test_a_planned_streaming_schedule_of_a_profiled_llama_trains_as_plain_autograd(tmp_path) -> None:
    """From a trace to training: the planner streams weights at its lowest budget, and two AdamW steps through
    the scheduled model leave the same parameters, bit for bit, as two plain ones."""
    from memprof import MemoryProfiler, load_trace
    from planner import chain_from_trace
    from planner.solvers.dispatch import min_feasible_budget, solve

    torch.manual_seed(0)
    case = real_models.llama()
    plain = copy.deepcopy(case.model)
    optimizer = torch.optim.AdamW(case.model.parameters(), lr=1e-3)
    batches = [case.make_batch(2) for _ in range(5)]
    with MemoryProfiler(case.model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for batch in batches[:3]:
            optimizer.zero_grad(set_to_none=True)
            case.loss(case.model, batch).backward()
            optimizer.step()
            profiler.record_stats()
    chain = chain_from_trace(load_trace(profiler.run_dir))
    assert chain.weights is not None and chain.step is not None
    schedule = solve(chain, min_feasible_budget(chain, "offload", stream_weights=True), "offload", stream_weights=True)
    assert schedule.streamed_weights
    # a measured run is compared with the step as the schedule runs it: the streamed state off the device
    from planner.measure.comparison import compare
    predicted = compare(schedule, load_trace(profiler.run_dir)).predicted_step_peak_bytes
    assert chain.step is not None and schedule.predicted_peak_bytes is not None
    assert predicted == schedule.predicted_step_peak_bytes < chain.step.step_peak_bytes(schedule.predicted_peak_bytes)

    plain.load_state_dict(case.model.state_dict())
    scheduled = copy.deepcopy(plain)
    apply_schedule(scheduled, schedule)
    for model in (plain, scheduled):
        model.train()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (plain, scheduled)]  # after apply_schedule
    for batch in batches[3:]:
        for model, opt in zip((plain, scheduled), optimizers):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(7)
            case.loss(model, batch).backward()
            opt.step()
    for (name, expected), found in zip(plain.named_parameters(), scheduled.parameters()):
        assert torch.equal(expected, found), name
