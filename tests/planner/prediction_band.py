"""How close a measured training step's peak must come to the planner's prediction, on the real-model tests.

The prediction is meant as an upper bound that is also tight. Measured on this project's 2-core CPU machine
(allocator truth: torch.profiler's raw memory events) for every algorithm on the seven models of
``tests/planner/real_models.py``, whole steps of 1.1 to 7.5 MB:

* above the prediction: at most +0.65% (GPT-2's store-all, 24 KiB); but selective schedules whose blocks keep
  some ops' outputs (recomputation options) measure up to +2.05% (Llama; BERT +1.19%): what a block holds while
  it recomputes part of itself is predicted low, found by this band and kept visible by its own bound;
* below it: at most 2.8% on GPT-2, BERT, Llama, MobileNet and ResNet; the ViT's predictions are 2.6% to 4.8%
  high and T5's 5.7% to 11.5% (their chains count memory the step does not hold at its peak: a known
  over-prediction, kept visible here by its own bound instead of one loose bound for every model); the
  encoder-decoder graph model of ``graph_models.py`` 3.9%.

The old bound, 5% + 1 MiB either way, was about 40% of these steps: wider than the activations the schedules
move (a schedule that freed nothing, or a prediction 1 MiB low, passed).
"""

from __future__ import annotations

#: The prediction may be below the measured peak by at most this fraction of it.
ABOVE = 0.01
#: The same for schedules with recomputation options (see above).
ABOVE_WITH_OPTIONS = 0.025
#: The measured peak may be below the prediction by at most this fraction of it, by model.
BELOW = {"t5": 0.12, "vit": 0.05, "seq2seq": 0.05}
DEFAULT_BELOW = 0.03


def band(predicted: int, model: str = "", above: float = ABOVE) -> tuple[float, float]:
    """The lowest and highest measured peak (bytes) that agree with ``predicted`` for ``model``."""
    return predicted * (1 - BELOW.get(model, DEFAULT_BELOW)), predicted * (1 + above)


def assert_near_prediction(measured: int, predicted: int, model: str = "", *context: object,
                           above: float = ABOVE) -> None:
    """Asserts that ``measured`` lies in :func:`band` of ``predicted``; ``context`` goes in the message."""
    low, high = band(predicted, model, above)
    error = (measured - predicted) / predicted
    assert low <= measured <= high, (*context, model, f"measured {measured}, predicted {predicted} ({error:+.2%})")


def assert_saving_as_predicted(saving: int, predicted_saving: int, store_all: int, model: str = "") -> None:
    """Asserts that a schedule saved what was predicted below store-all's peak: ``saving`` (measured, bytes)
    within the model's :data:`BELOW` fraction of the predicted store-all peak ``store_all`` of
    ``predicted_saving`` (measured: 0.1% to 2.1% of store-all's peak, T5 3.9%)."""
    slack = BELOW.get(model, DEFAULT_BELOW) * store_all
    assert predicted_saving > 0 and abs(saving - predicted_saving) <= slack, (model, saving, predicted_saving)
