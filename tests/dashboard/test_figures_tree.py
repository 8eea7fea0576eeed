"""The module treemap's boxes: tied weights counted once, a module's own allocations labelled."""

from __future__ import annotations

import pandas as pd

from dashboard.figures import layer_tree_figure
from dashboard.figures_tree import tree_boxes

KIB = 1024


def _gpt2_like() -> pd.DataFrame:
    # lm_head ties transformer.wte's weight: each subtree counts it, the root once (unique storages)
    rows = [("", "", 0, 0, "GPT2LMHeadModel", 3840 * KIB), ("transformer", "", 1, 1, "GPT2Model", 3840 * KIB),
            ("transformer.wte", "transformer", 2, 2, "Embedding", 512 * KIB),
            ("transformer.h", "transformer", 2, 3, "ModuleList", 3328 * KIB),
            ("lm_head", "", 1, 4, "Linear", 512 * KIB)]
    return pd.DataFrame(rows, columns=["module", "parent", "depth", "order", "kind", "weight_bytes"])


def test_a_tied_weight_is_counted_once_at_its_first_module():
    boxes = {b.id: b for b in tree_boxes(_gpt2_like(), "weight_bytes")}
    assert boxes["m:"].value_bytes == 3840 * KIB  # the model's size, not 4352 KiB
    assert boxes["m:transformer"].value_bytes == 3840 * KIB
    assert boxes["m:lm_head"].value_bytes == 0 and boxes["m:lm_head"].shared_bytes == 512 * KIB
    children = sum(b.value_bytes for b in boxes.values() if b.parent == "m:")
    assert children <= boxes["m:"].value_bytes


def test_treemap_figure_sums_to_the_model_and_says_what_is_shared():
    tree = layer_tree_figure(_gpt2_like(), "weight_bytes", root_label="GPT2LMHeadModel").data[0]
    values = dict(zip(tree.ids, tree.values))
    assert values["m:"] == 3840 * KIB
    hover = dict(zip(tree.ids, tree.hovertext))
    assert "512.0 KiB shared with an earlier module and counted there" in hover["m:lm_head"]


def test_a_modules_own_allocations_get_a_labelled_box():
    # the block allocates 100 B itself beside its two children's 30 + 40
    layers = pd.DataFrame({"module": ["", "block", "block.a", "block.b"], "parent": ["", "", "block", "block"],
                           "depth": [0, 1, 2, 2], "order": [0, 1, 2, 3], "kind": ["M", "Block", "L", "L"],
                           "feature_map_bytes": [170, 170, 30, 40]})
    tree = layer_tree_figure(layers, "feature_map_bytes").data[0]
    values = dict(zip(tree.ids, tree.values))
    labels = dict(zip(tree.ids, tree.labels))
    assert values["o:block"] == 100 and labels["o:block"] == "(own)"
    assert "held by the module itself" in dict(zip(tree.ids, tree.hovertext))["o:block"]
    assert sum(v for i, v in values.items() if tree.parents[list(tree.ids).index(i)] == "m:block") == 170


def test_a_real_gpt2s_tied_lm_head_is_counted_once(tmp_path):
    import torch

    from dashboard.data import TraceStore
    from memprof import MemoryProfiler
    from tests.planner.real_models import gpt2

    real = gpt2()
    model = real.model
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id="gpt2", print_period=0, background=False) as prof:
        optimizer.zero_grad(set_to_none=True)
        real.loss(model, real.make_batch(2)).backward()
        optimizer.step()
        prof.record_stats()
    layers = TraceStore(tmp_path).layers_at("gpt2", 0)
    unique = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields a tied one once
    tree = layer_tree_figure(layers, "weight_bytes", root_label="GPT2LMHeadModel").data[0]
    values = dict(zip(tree.ids, tree.values))
    assert values["m:"] == unique
    assert sum(v for i, v, parent in zip(tree.ids, tree.values, tree.parents) if parent == "m:") <= unique
    assert values["m:lm_head"] == 0  # its weight is wte's, counted in transformer
    assert "shared with an earlier module" in dict(zip(tree.ids, tree.hovertext))["m:lm_head"]
