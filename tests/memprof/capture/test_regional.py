"""A compiled model's costing iterations run its repeated blocks as compiled regions, marked around.

Which modules are blocks (by hand on small trees), that installing and removing leaves every ``forward`` as it
was, that the model's own backend and ``fullgraph`` are found, and on a Hugging Face GPT-2 compiled with inductor:
the costing iterations' blocks keep what the compiled block keeps (measured on the block alone with the
allocator), far less than eager autograd keeps, the run's headline is a compiled iteration, and the chain says its
schedules run compiled.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from memprof.capture.regional import RegionalBlocks, compile_settings, repeated_blocks
from memprof.capture.tensor_walk import module_tree
from planner import chain_from_trace
from planner.measure.compile_baseline import memory_events, running_peak
from tests.allocator_truth import allocator_rise_bytes
from tests.cli.helpers import exit_code


class _Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inner = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner[1](torch.relu(self.inner[0](x)))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))  # one Linear of each shape
        self.blocks = nn.ModuleList([_Block(), _Block(), _Block()])
        self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 3)])  # same class, other shapes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.heads[0](x).sum() + self.heads[1](x).sum()


def test_repeated_blocks_are_the_outermost_children_of_one_class_and_shape() -> None:
    names, modules = module_tree(_Net())
    found = [names[i] for i in repeated_blocks(names, modules)]
    # not blocks.0.inner.0 (inside a block), not the stem's or the heads' Linears (their shapes differ)
    assert found == ["blocks.0", "blocks.1", "blocks.2"]


def test_installing_and_removing_gives_every_forward_back() -> None:
    net = _Net()
    names, modules = module_tree(net)
    blocks = repeated_blocks(names, modules)
    own = lambda x: x  # noqa: E731 -- a forward set on the instance (accelerate's kind of wrapper)
    modules[blocks[1]].forward = own
    staged = type("Stage", (), {"memprof_stage": True, "__call__": lambda self, x: x})()
    modules[blocks[2]].forward = staged  # a schedule's stage: left to it
    regional = RegionalBlocks(modules, blocks, lambda *a: None, lambda *a: None, lambda on: None, "eager")
    regional.install()
    assert type(modules[blocks[0]].forward).__name__ == "_RegionalForward"
    assert type(modules[blocks[1]].forward).__name__ == "_RegionalForward"
    assert modules[blocks[2]].forward is staged
    regional.close()
    assert "forward" not in modules[blocks[0]].__dict__
    assert modules[blocks[1]].forward is own and modules[blocks[2]].forward is staged


def test_marks_are_made_around_each_region_and_the_blocks_submodules_are_muted_meanwhile() -> None:
    net = _Net()
    names, modules = module_tree(net)
    blocks = repeated_blocks(names, modules)
    marks: list[tuple[str, int]] = []
    muted: list[list[int]] = []
    regional = RegionalBlocks(modules, blocks, lambda i, m, a: marks.append(("enter", i)),
                              lambda i, m, a, o: marks.append(("exit", i)), lambda i: muted.append(list(i)), "eager")
    regional.install()
    try:
        out = net(torch.randn(2, 4))
    finally:
        regional.close()
    regional.remove()  # idempotent: the hooks are not turned on twice
    assert out.requires_grad
    assert marks == [(kind, b) for b in blocks for kind in ("enter", "exit")]
    # the blocks' submodules' hooks off while installed: dynamo guards on each hook's module number, so each
    # block would compile a region of its own; the others' stay (the model around the blocks is as profiled)
    inside = [names.index(f"blocks.{b}.inner{s}") for b in range(3) for s in ("", ".0", ".1")]
    assert muted == [sorted(inside), []]


def test_the_models_own_backend_and_fullgraph_are_found() -> None:
    net = _Net()
    backend, fullgraph = compile_settings(torch.compile(net, backend="aot_eager", fullgraph=True))
    assert fullgraph is True and callable(backend)
    backend, fullgraph = compile_settings(torch.compile(net))
    assert fullgraph is False and type(backend).__name__ == "_TorchCompileInductorWrapper"


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=511, eos_token_id=511)
    return GPT2LMHeadModel(config).train()


def _profile(runner: Any, optimizer: torch.optim.Optimizer, ids: torch.Tensor, out_dir: Any, steps: int) -> Any:
    """Trains through ``runner`` (a model, or a compiled one) for ``steps`` steps under the profiler; returns the
    run's directory."""
    with MemoryProfiler(runner, optimizer, out_dir=out_dir, print_period=0, background=False) as profiler:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            runner(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            profiler.record_stats()
    return profiler.run_dir


@pytest.mark.slow
def test_a_compiled_gpt2_is_costed_as_it_runs_compiled(tmp_path, capsys) -> None:
    model = _gpt2()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    ids = torch.randint(0, 512, (4, 64))
    runner = torch.compile(model)
    torch._dynamo.reset()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        runner(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    for _ in range(2):
        step()
    gc.collect()  # compile's garbage (reference cycles holding tensors) freed mid-step would lower the rise
    before = allocator_rise_bytes(step)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run_dir = _profile(runner, optimizer, ids, tmp_path, steps=5)
    assert any("compiled region of its own" in str(w.message) for w in said)
    # the compiled model holds no more than before: the costing iterations' graph breaks made dynamo run the frames
    # around the blocks eagerly for good (5 MB more on a 6-layer GPT-2) until they were reset, and compile's garbage
    # from them is collected (128 KiB of 4.3 MB more before it was). Measured in a process of its own 4,367,916 B
    # after for 4,433,452 before; after other compiled tests 4,335,148 (dynamo compiles the reset frames anew)
    step()
    gc.collect()
    after = allocator_rise_bytes(step)
    assert after <= 1.005 * before, (after, before)
    trace = load_trace(run_dir)
    assert trace.meta["regional_iterations"] == [1, 2] and trace.meta["eager_iterations"] == []
    assert trace.costing_iterations == [1, 2]
    assert set(trace.headline_iterations.iteration) == {0, 3, 4}
    # the report names a compiled iteration and says what the costing ones were
    assert exit_code(["report", str(run_dir)]) == 0
    said = capsys.readouterr().out
    assert "iteration(s) 1, 2 are costing iterations" in said
    shown = int(said.split("memprof | iteration ")[1].split()[0])
    assert shown in (0, 3, 4), said
    assert exit_code(["plan", str(run_dir), "--budget", "1GiB", "--out", str(tmp_path / "s.json")]) == 0
    assert "apply_schedule runs its stages compiled too" in capsys.readouterr().out
    layers = trace.layers.set_index(["iteration", "module"])
    assert layers.loc[(2, "transformer.h.1"), "output_bytes"] == 4 * 64 * 64 * 4  # batch x seq x width float32
    assert layers.loc[(2, "transformer.h.1.attn"), "output_bytes"] == 0  # inside the compiled region
    # a costing iteration runs as the compiled model does, up to the graph breaks between blocks: here 2.3% higher
    # (5,304,132 B for 5,183,372), on a 6-layer GPT-2 of width 256 0.7% (eager ones: 56.8 MiB for 41.0 in issue 52)
    peaks = trace.iterations.set_index("iteration").peak_allocated_bytes
    assert abs(int(peaks[2]) - int(peaks[4])) <= 0.05 * int(peaks[4]), peaks
    chain = chain_from_trace(trace)
    assert chain.source["compiled"] is True
    # what a compiled block keeps for its backward, measured on the block alone
    block = model.transformer.h[1]
    x = torch.randn(4, 64, 64, requires_grad=True)
    compiled_block = torch.compile(block.forward)
    compiled_block(x)[0].sum().backward()  # compiled, warm
    out, events = memory_events(lambda: compiled_block(x))
    compiled_kept = running_peak(events)[1]
    out, events = memory_events(lambda: block(x))
    eager_kept = running_peak(events)[1]
    del out
    stage = chain.stages[1]
    assert stage.modules == ("transformer.h.1",)
    # what the compiled region keeps (alone it keeps 1,056,768 B here, in the model one output more), far below
    # what eager autograd keeps (1,843,224 B), which the eager costing iterations used to plan with
    assert compiled_kept <= stage.saved_bytes <= compiled_kept + stage.output_bytes, (stage.saved_bytes, compiled_kept)
    assert stage.saved_bytes < 0.75 * eager_kept, (stage.saved_bytes, eager_kept)
    torch._dynamo.reset()


@pytest.mark.slow
def test_blocks_the_user_compiled_on_their_own_are_costed_compiled_in_every_iteration(tmp_path) -> None:
    model = _gpt2()
    for block in model.transformer.h:
        block.compile()  # PyTorch's regional compilation
    calls = [block._compiled_call_impl for block in model.transformer.h]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    ids = torch.randint(0, 512, (4, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_dir = _profile(model, optimizer, ids, tmp_path, steps=3)
    # given back as they were
    assert [block._compiled_call_impl for block in model.transformer.h] == calls
    assert all("forward" not in block.__dict__ for block in model.transformer.h)
    trace = load_trace(run_dir)
    assert trace.meta["compiled_regions"] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert trace.costing_iterations == []  # every iteration has the blocks' compiled costs
    layers = trace.layers.set_index(["iteration", "module"])
    kept = [int(layers.loc[(i, "transformer.h.1"), "saved_bytes"]) for i in (1, 2)]
    assert kept[0] == kept[1] and kept[0] < 0.75 * 1_843_224  # eager autograd keeps 1,843,224 B here
    assert int(layers.loc[(2, "transformer.h.1.attn"), "output_bytes"]) == 0  # inside the region
    assert int(layers.loc[(2, "transformer.wte"), "output_bytes"]) == 4 * 64 * 64 * 4  # outside: hooked
    assert chain_from_trace(trace).source["compiled"] is True
    torch._dynamo.reset()


def test_compiles_garbage_is_collected_before_the_costing_iterations(tmp_path) -> None:
    # Dynamo's reference cycles hold real tensors (a compiled frame's locals) until the collector next runs; a
    # costing iteration that started with them counted them as held by the step (a plan's peak 19% high on a GPT-2
    # in some processes). Here a cycle made in iteration 0 holds 1 MiB, and the collector runs only when called.
    net = _Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    runner = torch.compile(net, backend="aot_eager")
    torch._dynamo.reset()
    held = 2**20
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with MemoryProfiler(runner, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
                for step in range(4):
                    optimizer.zero_grad(set_to_none=True)
                    runner(torch.randn(16, 4)).backward()
                    if step == 0:
                        cycle: list[Any] = [torch.empty(held, dtype=torch.uint8)]
                        cycle.append(cycle)
                        del cycle
                    optimizer.step()
                    profiler.record_stats()
    finally:
        gc.enable()
        torch._dynamo.reset()
    trace = load_trace(profiler.run_dir)
    assert trace.meta["regional_iterations"] == [1, 2]
    events = trace.read("events", iterations=[1, 2, 3])
    start = events.groupby("iteration").allocated_bytes.first()
    assert (start < held).all(), start  # nothing of the cycle's at any costing iteration's start
