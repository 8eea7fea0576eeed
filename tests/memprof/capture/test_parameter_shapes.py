"""meta.json's parameter_shapes: every parameter of the profiled model, once, with its shape and dtype."""

from __future__ import annotations

import json

import torch
from torch import nn

from memprof import MemoryProfiler
from memprof.capture.parameter_shapes import PARAMETER_SHAPES_KEY, parameter_shapes
from tests.planner import models as M


def test_meta_json_holds_each_parameters_shape_and_dtype(tmp_path) -> None:
    model = M.LoopModel(dim=6, blocks=2)
    model.head.to(torch.float64)
    with MemoryProfiler(model, out_dir=tmp_path, print_period=0, background=False) as profiler:
        pass  # written when the run opens
    meta = json.loads((profiler.run_dir / "meta.json").read_text())
    assert meta[PARAMETER_SHAPES_KEY] == {
        "embed.weight": [6, 6, "float32"], "embed.bias": [6, "float32"],
        "blocks.0.linear.weight": [6, 6, "float32"], "blocks.0.linear.bias": [6, "float32"],
        "blocks.1.linear.weight": [6, 6, "float32"], "blocks.1.linear.bias": [6, "float32"],
        "head.weight": [2, 6, "float64"], "head.bias": [2, "float64"],
    }


def test_a_tied_parameter_is_listed_once_and_a_compiled_model_by_its_eager_names() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    assert parameter_shapes(model) == {"0.weight": [10, 4, "float32"]}
    assert parameter_shapes(torch.compile(model)) == {"_orig_mod.0.weight": [10, 4, "float32"]}  # the profiler unwraps


def test_a_lazy_module_not_yet_run_has_no_shapes() -> None:
    assert parameter_shapes(nn.Sequential(nn.LazyLinear(3))) is None
