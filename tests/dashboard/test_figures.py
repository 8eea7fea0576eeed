"""Figure builders of the trace views: the values plotted are the data, names stay text."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.figures import (
    byte_ticks,
    empty_figure,
    headline,
    layer_tree_figure,
    plot_text,
)
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes
from tests.dashboard.fixtures import HTML_NAME, LAYER_WEIGHT_BYTES, WEIGHTS_BYTES


def _iterations(peaks, reserved, **cats):
    frame = pd.DataFrame({"iteration": range(len(peaks)), "peak_allocated_bytes": peaks,
                          "peak_reserved_bytes": reserved})
    for c in CATEGORY_COLUMNS:
        frame[c] = cats.get(c, [0] * len(peaks))
    return frame


def test_plot_text_escapes_markup():
    assert plot_text("<b>x</b> & y") == "&lt;b&gt;x&lt;/b&gt; &amp; y"
    assert plot_text("features.0") == "features.0"


def test_headline_names_peak_dominant_and_cache():
    frame = _iterations([1000, 3000], [4096, 4096], weights=[600, 600], feature_maps=[400, 2400])
    frame["peak_phase"] = ["forward", "backward"]
    frame["peak_module"] = ["a", "layer.<b>"]
    text = headline(frame)
    assert text.startswith(f"Peak {format_bytes(3000)} allocated at iteration 1 during backward in layer.<b>")
    assert "feature_maps dominates with 2.3 KiB (80%)" in text
    assert f"allocator cache {format_bytes(1096)} (27% of 4.0 KiB reserved)" in text


def test_headline_without_cache_or_iterations():
    assert "no allocator cache" in headline(_iterations([100], [0], other=[100]))
    assert headline(_iterations([], [])) == "This run has no recorded iterations yet."


def test_treemap_sizes_by_bytes_and_escapes_names(store):
    layers = store.layers_at("mlp", 0)
    fig = layer_tree_figure(layers, "weight_bytes", root_label="Net")
    tree = fig.data[0]
    values = dict(zip(tree.ids, tree.values))
    assert values["m:"] == WEIGHTS_BYTES and values["m:features"] == WEIGHTS_BYTES
    assert values["m:features.0"] == LAYER_WEIGHT_BYTES[0]
    assert values[f"m:features.{HTML_NAME}"] == LAYER_WEIGHT_BYTES[2]
    assert all("<img" not in label for label in tree.labels)
    assert "&lt;img src=x onerror=alert(1)&gt;" in tree.labels
    assert all("<img" not in text for text in tree.hovertext)
    assert tree.branchvalues == "total"


def test_treemap_parent_at_least_sum_of_children():
    # The container's own figure (10) is smaller than its children's sum (30 + 40).
    layers = pd.DataFrame({"module": ["", "a", "a.x", "a.y"], "parent": ["", "", "a", "a"], "depth": [0, 1, 2, 2],
                           "kind": ["M", "S", "L", "L"], "saved_bytes": [0, 10, 30, 40]})
    values = dict(zip(layer_tree_figure(layers, "saved_bytes").data[0].ids,
                      layer_tree_figure(layers, "saved_bytes").data[0].values))
    assert values == {"m:": 70, "m:a": 70, "m:a.x": 30, "m:a.y": 40}


def test_treemap_without_root_row_adds_one():
    layers = pd.DataFrame({"module": ["a", "b"], "parent": ["", ""], "depth": [1, 1], "kind": ["L", "L"],
                           "weight_bytes": np.array([5, 7])})
    tree = layer_tree_figure(layers, "weight_bytes", root_label="Model").data[0]
    assert dict(zip(tree.ids, tree.values)) == {"m:a": 5, "m:b": 7, "m:": 12}


def test_empty_figure_escapes_its_message():
    fig = empty_figure("no <script>")
    assert fig.layout.annotations[0].text == "no &lt;script&gt;"


def test_byte_ticks_use_binary_units():
    ticks = byte_ticks(60 * 1024**2)
    assert ticks["ticktext"] == ["0", "10 MiB", "20 MiB", "30 MiB", "40 MiB", "50 MiB", "60 MiB"]
    assert ticks["tickvals"][1] == 10 * 1024**2
    assert byte_ticks(500)["ticktext"][:3] == ["0", "100 B", "200 B"]
    assert byte_ticks(3 * 1024**3)["ticktext"][1] == "0.5 GiB"
    assert byte_ticks(0) == {} and byte_ticks(float("nan")) == {}


def test_byte_ticks_over_a_window_far_from_zero():
    # whole-step budgets: a narrow window above the model state still gets ticks inside it
    ticks = byte_ticks(3.4 * 1024**3, bottom_bytes=3.1 * 1024**3)
    assert ticks["ticktext"][0] == "3.1 GiB" and ticks["ticktext"][-1] == "3.4 GiB"
    assert len([v for v in ticks["tickvals"] if 3.1 * 1024**3 <= v <= 3.4 * 1024**3]) >= 4
    assert byte_ticks(500, bottom_bytes=-5) == byte_ticks(500) == byte_ticks(500, bottom_bytes=900)


def test_iteration_axis_ticks_whole_iterations_only():
    from dashboard.figures import iteration_axis

    assert iteration_axis([0, 1])["dtick"] == 1
    assert iteration_axis(list(range(1000)))["dtick"] == 100
    assert iteration_axis([])["dtick"] == 1


def test_byte_axis_names_its_unit_and_ticks_in_numbers():
    from dashboard.figures import byte_axis, bytes_texts

    axis = byte_axis("peak allocated", 60 * 1024**2)
    assert axis["title"]["text"] == "peak allocated (MiB)" and axis["automargin"] is True
    assert axis["ticktext"] == ["0", "10", "20", "30", "40", "50", "60"]
    assert byte_axis("x", 0)["title"]["text"] == "x (B)" and "tickvals" not in byte_axis("x", 0)
    sizes = [0, 1, 1023, 1024, 1536, 17.9 * 1024**2, 114 * 1024**2, -2048, 3 * 1024**3]
    assert bytes_texts(sizes) == [format_bytes(s) for s in sizes]


def test_headline_skips_a_compiled_runs_costing_iterations():
    # iteration 1 ran block by block for the layers (a costing iteration) and peaked highest; 2 ran compiled
    frame = _iterations([1000, 5000, 3000], [0, 0, 0], feature_maps=[500, 4000, 2000])
    assert headline(frame, costing={1}).startswith(f"Peak {format_bytes(3000)} allocated at iteration 2")
    assert headline(frame).startswith(f"Peak {format_bytes(5000)} allocated at iteration 1")
    # every iteration a costing one: still a headline
    assert headline(frame, costing={0, 1, 2}).startswith(f"Peak {format_bytes(5000)}")
