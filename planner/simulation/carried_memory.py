"""The memory rule for tensors carried across stages (skip connections, an encoder's output).

A stage may read, besides the running activation ``a^{l-1}``, a tensor made by an earlier stage ``p`` (a
U-Net's encoder output at its level, an encoder's output read by every decoder layer) or before the chain
(a decoder's target embedding). The executor keeps it from the first forward to the backward of its last
reader (the seed's "keep skip tensors as checkpoints") and hands its gradient back through autograd, which
sums it with the gradient the next stage returns, as in plain autograd. The simulator (:func:`with_carried`,
applied by :func:`planner.simulation.simulator.simulate`) adds, to its memory during each operation:

* the tensor's bytes from the first operation that drops the original ``a^p`` (an ``F_none(p+1)`` of the
  forward, a recomputation that replaces it) up to the backward of its first reader, ``B(min consumers)``:
  before the drop the chain itself counts the same storage; after that backward nothing holds it;
* its gradient's bytes after the backward of its last reader, ``B(max consumers)``, up to ``B(p+1)``,
  whose result it is summed into (to the end for a tensor made before the chain and ``grad`` set). During
  ``B(max consumers)`` itself it is part of that stage's measured backward overhead.

A tensor made before the chain (``producer == 0``) is held by the step anyway (``StepCosts.base_bytes``), so
only its gradient counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.model.chain import Chain
from planner.model.schedule import OpKind
from planner.simulation.prediction import Prediction, TimelinePoint

__all__ = ["extra_bytes", "with_carried"]


def extra_bytes(chain: Chain, points: Sequence[TimelinePoint]) -> list[int]:
    """The carried memory during each operation of a replayed schedule (the rule in the module's docstring)."""
    extra = [0] * len(points)
    backward = {p.op.stage: p.index for p in points if p.op.kind is OpKind.B}
    for item in chain.carried:
        last_b = backward[item.consumers[0]]
        if item.producer > 0:
            start = _dropped(points, item.producer)
            for index in range(start + 1, last_b + 1):
                extra[index] += item.size_bytes
        if item.grad:
            end = backward.get(item.producer + 1, len(points) - 1) if item.producer > 0 else len(points) - 1
            for index in range(backward[item.consumers[-1]] + 1, end + 1):
                extra[index] += item.size_bytes
    return extra


def _dropped(points: Sequence[TimelinePoint], stage: int) -> int:
    """The index of the operation after which the chain no longer holds the first forward's ``a^stage``."""
    names = {f"a^{stage}", f"abar^{stage}"}
    first = next(p.index for p in points if p.op.kind.is_forward and p.op.stage == stage)
    for point in points[first + 1 :]:
        if names & set(point.freed) and not point.op.kind.is_transfer:
            return point.index
    return len(points)


def with_carried(chain: Chain, prediction: Prediction) -> Prediction:
    """``prediction`` of the chain's own values with the carried tensors' memory added: during each operation
    (``peak_bytes``), after it (``memory_bytes``: what the next operation starts from) and at the peak."""
    if not chain.carried or not prediction.timeline:
        return prediction
    points = prediction.timeline
    extra = extra_bytes(chain, points)
    after = [*extra[1:], extra[-1]]  # held after operation i: what operation i + 1 starts with
    timeline = tuple(replace(p, memory_bytes=p.memory_bytes + a, peak_bytes=p.peak_bytes + e)
                     for p, e, a in zip(points, extra, after))
    return replace(prediction, timeline=timeline,
                   peak_bytes=max(prediction.peak_bytes, *(p.peak_bytes for p in timeline)))
