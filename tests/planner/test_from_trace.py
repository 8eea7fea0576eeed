"""Chains found in real profiled models, with costs from the trace."""

from __future__ import annotations

import pytest
import torch

from memprof import zoo
from planner import Chain, NotAChainError
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
    chain = Chain.from_trace(traces["mlp"])
    assert chain.length == 9 and chain.source["container"] == "" and chain.source["auto"]
    assert [s.modules for s in chain.stages[:-1]] == [(str(i),) for i in range(9)]
    assert chain.input_bytes == 8 * 128 * 4  # the batch: 8 x 128 floats
    hidden = 8 * 256 * 4
    assert all(s.output_bytes == hidden for s in chain.stages[:8])
    assert chain.stages[8].output_bytes == 8 * 10 * 4
    assert all(s.saved_bytes >= s.output_bytes for s in chain.stages)
    assert chain.stages[-1].name == "loss"


def test_views_and_in_place_layers_fold_into_the_previous_stage(traces):
    chain = Chain.from_trace(traces["cnn"])
    assert [s.modules for s in chain.stages[:-1]] == [("stem",), ("features",), ("pool", "flatten"), ("dropout",),
                                                      ("head",)]


def test_named_container(traces):
    chain = Chain.from_trace(traces["cnn"], container="features")
    assert chain.length == 4 and chain.source["modules"] == [["features.0"], ["features.1"], ["features.2"],
                                                             ["features.3"]]
    assert Chain.from_trace(traces["transformer"]).source["container"] == "h"


def test_bad_containers_are_refused(traces):
    with pytest.raises(NotAChainError, match="no module named 'nope'"):
        Chain.from_trace(traces["cnn"], container="nope")
    with pytest.raises(NotAChainError, match="do not form one chain"):
        Chain.from_trace(traces["transformer"], container="")


def test_chain_survives_json(traces):
    chain = Chain.from_trace(traces["transformer"])
    again = Chain.from_json(chain.to_json())
    assert again == chain and again.fingerprint() == chain.fingerprint()
