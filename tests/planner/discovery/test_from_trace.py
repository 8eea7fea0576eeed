"""Chains found in real profiled models, with costs from the trace."""

from __future__ import annotations

import pytest
import torch

from examples import zoo
from planner import Chain, NotAChainError, chain_from_trace
from tests.memprof.helpers import profile_steps


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = {}
    for name in ("mlp", "cnn", "transformer"):
        torch.manual_seed(0)
        model, make_batch = zoo.ZOO[name]()
        out[name] = profile_steps(model, make_batch, tmp_path_factory.mktemp(name), steps=3)
    return out


def test_mlp_chain_is_every_layer_with_exact_sizes(traces):
    chain = chain_from_trace(traces["mlp"])
    assert chain.length == 5 and chain.source["container"] == "" and chain.source["auto"]
    # a Linear's output is freed once the ReLU after it has run (ReLU keeps only its own output), so each
    # Linear + ReLU pair is one stage; the last Linear stands alone
    assert [s.modules for s in chain.stages[:-1]] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7"), ("8",)]
    assert chain.input_bytes == 8 * 128 * 4  # the batch: 8 x 128 floats
    hidden = 8 * 256 * 4
    assert all(s.output_bytes == s.saved_bytes == hidden for s in chain.stages[:4])  # the ReLU's output alone
    assert chain.stages[4].output_bytes == 8 * 10 * 4
    assert all(s.saved_bytes >= s.output_bytes for s in chain.stages)
    assert chain.stages[-1].name == "loss"


def test_views_and_in_place_layers_fold_into_the_previous_stage(traces):
    chain = chain_from_trace(traces["cnn"])
    # features (an nn.Sequential) is opened into its blocks; the stem (a Sequential subclass, a block) stays
    # the pooled output is freed once dropout has run (dropout keeps its mask), so they are one stage
    assert [s.modules for s in chain.stages[:-1]] == [("stem",), *((f"features.{i}",) for i in range(4)),
                                                      ("pool", "flatten", "dropout"), ("head",)]
    assert "saves up to" in chain.source["why"]


class _Merge(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class _Looped(torch.nn.Module):
    """Blocks in an nn.ModuleList called in a loop, then a skip connection read by a module."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.down = torch.nn.Linear(16, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.up = torch.nn.Linear(16, 16)
        self.merge = _Merge()
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        skip = self.down(h)  # read again by `merge`: down -> mid is not a link whose input the rules may free
        return self.head(self.merge(self.up(self.mid(skip)), skip))


def test_blocks_called_in_a_loop_are_a_chain_and_a_skip_cuts_one(tmp_path):
    from planner.discovery.chain_finder import ModuleTree, candidates
    from planner.discovery.from_trace import _structure

    torch.manual_seed(0)
    model = _Looped()
    trace = profile_steps(model, lambda n: (torch.randn(n, 8), torch.randint(0, 3, (n,))), tmp_path, steps=2)
    chain = chain_from_trace(trace)
    assert [s.modules for s in chain.stages[:-1]][:5] == [("stem",), *((f"blocks.{i}",) for i in range(4))]
    found = [c.modules for c in candidates(ModuleTree(_structure(trace)))]
    assert not any("down" in modules and "mid" in modules for modules in found)


def test_named_container(traces):
    chain = chain_from_trace(traces["cnn"], container="features")
    assert chain.length == 4 and chain.source["modules"] == [["features.0"], ["features.1"], ["features.2"],
                                                             ["features.3"]]
    assert chain_from_trace(traces["transformer"]).source["container"] == "h"


def test_bad_containers_are_refused(traces):
    with pytest.raises(NotAChainError, match="no module named 'nope'"):
        chain_from_trace(traces["cnn"], container="nope")
    with pytest.raises(NotAChainError, match="do not form one chain"):
        chain_from_trace(traces["transformer"], container="")


def test_chain_survives_json(traces):
    chain = chain_from_trace(traces["transformer"])
    again = Chain.from_json(chain.to_json())
    assert again == chain and again.fingerprint() == chain.fingerprint()



@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A transformer profiled for 3 steps with a planning pass (iteration 1 records its ops)."""
    torch.manual_seed(0)
    model, make_batch = zoo.ZOO["transformer"]()
    return profile_steps(model, make_batch, tmp_path_factory.mktemp("ops"), steps=3, background=False, ops=True)


def test_options_pay_the_selective_overhead_the_planning_pass_measured(planned):
    from planner.discovery.option_builder import ops_of_stage, with_options

    overhead_ms = planned.meta["selective_overhead_us_per_op"] / 1000
    assert overhead_ms > 0
    chain = chain_from_trace(planned)
    records = planned.op_records()
    by_stage = {i: ops_of_stage(records, s) for i, s in enumerate(chain.stages[:-1], start=1)}
    free = with_options(chain, {i: ops for i, ops in by_stage.items() if ops})
    assert any(stage.options for stage in chain.stages)
    for number, (paid, plain) in enumerate(zip(chain.stages[:-1], free.stages), start=1):
        assert [o.saved_bytes for o in paid.options] == [o.saved_bytes for o in plain.options]
        extra = len(by_stage[number]) * overhead_ms
        assert [o.recompute_ms for o in paid.options] == pytest.approx([o.recompute_ms + extra for o in plain.options])
    unpriced = chain_from_trace(planned, selective_overhead_us=0.0)  # a device whose kernels hide the dispatch
    assert [s.options for s in unpriced.stages] == [s.options for s in free.stages]


def test_the_planning_pass_iteration_is_left_out_of_the_costs(planned):
    """Iteration 0 warms up and iteration 1 runs under the op recorder (several times slower): the stages
    are costed from iteration 2 alone."""
    chain = chain_from_trace(planned)
    layers = planned.read("layers")
    times = layers[layers.iteration == 2].set_index("module")
    for stage in chain.stages[:-1]:
        assert stage.forward_ms == pytest.approx(sum(times.forward_ms[m] for m in stage.modules))
        assert stage.backward_ms == pytest.approx(sum(times.backward_ms[m] for m in stage.modules))


def test_a_bad_selective_overhead_in_meta_is_refused(planned, tmp_path):
    import json
    import shutil

    from memprof import load_trace
    from planner.errors import ChainError

    copy = tmp_path / "run"
    shutil.copytree(planned.path, copy)
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "selective_overhead_us_per_op": "fast"}))
    with pytest.raises(ChainError, match="selective_overhead_us_per_op must be a non-negative number"):
        chain_from_trace(load_trace(copy))
    with pytest.raises(ChainError, match="selective_overhead_us must be a non-negative number"):
        chain_from_trace(planned, selective_overhead_us=-1.0)
