"""Gradient accumulation: ``record_stats()`` once per optimizer step over 4 micro-batches of a Hugging Face GPT-2.

The trace's layers are one micro-batch's (exact bytes, the same as a single-forward step's), the iteration's
peak is the whole step's (allocator truth), and the iteration says how many micro-batches it had.
"""

from __future__ import annotations

import io

import pandas as pd
import pytest

from memprof import load_trace
from planner.measure.compile_baseline import memory_events, running_peak
from tests.accumulation import (
    BATCH,
    MICRO_BATCHES,
    SEQ,
    accumulation_step,
    gpt2_without_dropout,
    profile_accumulation,
)

pytestmark = pytest.mark.slow

FP32 = 4
#: The byte columns of a module's forward: the same for a micro-batch as for a step of one forward.
FORWARD_BYTES = ["calls", "output_bytes", "saved_bytes", "feature_map_bytes", "input_bytes", "grad_input_bytes",
                 "forward_overhead_bytes", "weight_bytes", "weight_grad_bytes", "buffer_bytes"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("accumulation")
    report = io.StringIO()
    real = gpt2_without_dropout()
    # in the background worker, as by default: it runs the same analysis as the inline processing below
    accumulated, optimizer = profile_accumulation(real, out, MICRO_BATCHES, stream=report, background=True)
    single, _ = profile_accumulation(gpt2_without_dropout(), out, 1)
    kept, _ = profile_accumulation(gpt2_without_dropout(), out, 1, set_to_none=False)
    return {"real": real, "optimizer": optimizer, "report": report.getvalue(), "accumulated": load_trace(accumulated),
            "single": load_trace(single), "kept": load_trace(kept)}


def _layers(trace) -> pd.DataFrame:
    return trace.read("layers", iterations=[trace.detail_iterations[-1]]).set_index("module").sort_index()


def test_the_iterations_say_how_many_micro_batches_they_had(runs) -> None:
    assert runs["accumulated"].iterations.micro_batches.tolist() == [MICRO_BATCHES] * 3
    assert runs["single"].iterations.micro_batches.tolist() == [1] * 3
    assert "4 micro-batches (gradient accumulation): the peak is the whole step's" in runs["report"]


def test_layers_are_one_micro_batch_with_the_bytes_of_a_single_forward_step(runs) -> None:
    accumulated, single, kept = _layers(runs["accumulated"]), _layers(runs["single"]), _layers(runs["kept"])
    assert list(accumulated.index) == list(single.index)
    pd.testing.assert_frame_equal(accumulated[FORWARD_BYTES], single[FORWARD_BYTES])
    # By hand: a block returns (batch, seq, 64) floats; the MLP's c_fc (a Conv1D, a Linear with its weight
    # transposed) (batch, seq, 256); lm_head, an nn.Linear(64, 512) tied to the token embedding, the logits.
    tokens = BATCH * SEQ
    assert accumulated.at["transformer.h.2", "output_bytes"] == tokens * 64 * FP32 == 16_384
    assert accumulated.at["transformer.h.2.mlp.c_fc", "output_bytes"] == tokens * 256 * FP32 == 65_536
    assert accumulated.at["lm_head", "output_bytes"] == tokens * 512 * FP32 == 131_072
    assert accumulated.at["lm_head", "weight_bytes"] == 512 * 64 * FP32
    assert (accumulated.loc[accumulated.index != "transformer.h", "calls"] == 1).all()
    # The last micro-batch's backward adds each weight's gradient to the one already held (autograd allocates
    # it, adds it in place and frees it): the transient of a step that keeps its gradients (set_to_none=False).
    assert accumulated.backward_overhead_bytes.equals(kept.backward_overhead_bytes)
    assert (accumulated.backward_overhead_bytes >= single.backward_overhead_bytes).all()
    assert accumulated.at["transformer.h.2", "backward_overhead_bytes"] > single.at["transformer.h.2",
                                                                                   "backward_overhead_bytes"]
    numeric = [c for c in accumulated.columns if c not in ("iteration", "forward_ms", "backward_ms")
               and pd.api.types.is_integer_dtype(accumulated[c])]
    pd.testing.assert_frame_equal(accumulated[numeric], kept[numeric])


def test_the_peak_is_the_whole_steps_as_the_allocator_saw_it(runs) -> None:
    real, optimizer, trace = runs["real"], runs["optimizer"], runs["accumulated"]
    _, deltas = memory_events(lambda: accumulation_step(real, real.model, optimizer, lambda: real.make_batch(BATCH)))
    truth = running_peak(deltas)[0]  # the rise over what the step started with
    last = trace.detail_iterations[-1]
    events = trace.read("events", iterations=[last])
    start = int(events[events.event == "start"].allocated_bytes.iloc[0])
    peak = int(trace.iterations.set_index("iteration").at[last, "peak_allocated_bytes"])
    assert abs((peak - start) - truth) <= 0.001 * truth, (peak - start, truth)
    # It lies in a micro-batch after the first, which holds the earlier ones' gradients beside its own
    # activations: a single-forward step's peak plus the gradients (measured: equal to the byte).
    single = int(runs["single"].iterations.peak_allocated_bytes.iloc[-1])
    grads = int(trace.iterations.weight_grads.iloc[-1])
    assert abs(peak - (single + grads)) <= 0.01 * peak, (peak, single, grads)
