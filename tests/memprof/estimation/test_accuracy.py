"""The estimated step peak against the allocator's measured peak of the same step, model by model.

Every model of :mod:`tests.memprof.estimation.cases` runs with every optimizer (SGD with momentum, Adam,
AdamW; foreach and not): the estimate, on fake tensors, must be within 3% of torch.profiler's peak of the
real step on the CPU (same seed, same shapes). A covering set (every model, every optimizer at least once)
runs by default; the rest of the product is marked slow.
"""

from __future__ import annotations

import pytest

from memprof import estimate, load_trace
from memprof.categories import CATEGORY_COLUMNS
from tests.memprof.estimation.cases import CASES, OPTIMIZERS, measured_peak

TOLERANCE = 0.03
_MODELS = sorted(CASES)
_OPTIMIZERS = sorted(OPTIMIZERS)
# model i runs by default with optimizer i (mod 6), and the MLP with all of them
_COVERING = {(m, _OPTIMIZERS[i % len(_OPTIMIZERS)]) for i, m in enumerate(_MODELS)} | {("mlp", o) for o in _OPTIMIZERS}
_PAIRS = [pytest.param(m, o, marks=() if (m, o) in _COVERING else pytest.mark.slow)
          for m in _MODELS for o in _OPTIMIZERS]


@pytest.mark.slow
@pytest.mark.parametrize(("model_name", "optimizer_name"), _PAIRS)
def test_estimated_peak_is_within_3_percent_of_the_measured_peak(tmp_path, model_name, optimizer_name):
    model, batch, loss_fn = CASES[model_name].build()
    predicted = estimate(model, batch, loss_fn, OPTIMIZERS[optimizer_name], out_dir=tmp_path)
    model, batch, loss_fn = CASES[model_name].build()  # a fresh model: the same seed, the same shapes
    measured = measured_peak(model, batch, loss_fn, OPTIMIZERS[optimizer_name])
    error = (predicted.peak_bytes - measured) / measured
    assert abs(error) <= TOLERANCE, f"estimated {predicted.peak_bytes}, measured {measured} ({error:+.2%})"
    # the trace says the same as the result, and its categories sum to the peak
    row = load_trace(predicted.run_dir).iterations.set_index("iteration").loc[1]
    assert row.peak_allocated_bytes == predicted.peak_bytes
    assert sum(int(row[c]) for c in CATEGORY_COLUMNS) == predicted.peak_bytes
    assert sum(predicted.categories_at_peak_bytes.values()) == predicted.peak_bytes
