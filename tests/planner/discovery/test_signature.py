"""The signature chain_from_trace gives a chain: the stage modules, their parameters, their containers, the root."""

from __future__ import annotations

import pytest
import torch

from memprof import MemoryProfiler, load_trace
from planner import chain_from_trace
from planner.errors import ChainError
from planner.model.signature import ContainerSpec, ModuleSpec, ParameterSpec
from tests.planner import models as M


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model = M.LoopModel(dim=6, blocks=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("loop"), print_period=0,
                        background=False) as profiler:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(5, 6)).square().mean().backward()
            optimizer.step()
            profiler.record_stats()
    return profiler.run_dir


def linear(name: str, inputs: int, outputs: int, kind: str = "Linear", prefix: str = "") -> ModuleSpec:
    return ModuleSpec(name, kind, (ParameterSpec(f"{prefix}bias", (outputs,), "float32"),
                                   ParameterSpec(f"{prefix}weight", (outputs, inputs), "float32")))


def test_the_signature_holds_the_stage_modules_their_parameters_and_containers(run_dir) -> None:
    chain = chain_from_trace(load_trace(run_dir))
    signature = chain.signature
    assert chain.module_names == ("embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head")
    assert signature.root_kind == "LoopModel"
    assert signature.parameter_count == 5 * (6 * 6 + 6) + (2 * 6 + 2)  # embed and 4 blocks, the head
    assert signature.weight_bytes is None
    assert signature.input_bytes == chain.input_bytes == 5 * 6 * 4  # the batch, float32
    assert signature.modules == (
        linear("embed", 6, 6),
        *(linear(f"blocks.{i}", 6, 6, "LoopBlock", "linear.") for i in range(4)),
        linear("head", 6, 2),
    )
    assert signature.containers == (ContainerSpec("", ("embed", "blocks", "head")),
                                    ContainerSpec("blocks", ("0", "1", "2", "3")))


def test_a_run_without_parameter_shapes_gives_the_layers_weight_bytes(run_dir) -> None:
    trace = load_trace(run_dir)
    del trace.meta["parameter_shapes"]  # as a run recorded before the key
    signature = chain_from_trace(trace).signature
    assert signature.parameter_count is None
    assert signature.weight_bytes == 224 * 4
    assert [(m.name, m.parameters, m.weight_bytes) for m in signature.modules] == [
        ("embed", None, 42 * 4), *((f"blocks.{i}", None, 42 * 4) for i in range(4)), ("head", None, 14 * 4)]


def test_malformed_parameter_shapes_are_refused(run_dir) -> None:
    trace = load_trace(run_dir)
    trace.meta["parameter_shapes"] = {"embed.weight": [6, "six", "float32"]}
    with pytest.raises(ChainError, match=r"meta.json's parameter_shapes\['embed.weight'\] must be \[dims..., dtype\]"):
        chain_from_trace(trace)
