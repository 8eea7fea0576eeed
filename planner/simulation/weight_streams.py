"""The simulator's rules for streamed weights: when their copies run and what the device holds of them.

A schedule streams the weights of a set S of stages (``Schedule.params.streamed_weights``; sizes in
:class:`planner.model.weights.WeightCosts`). The copies are implicit -- the schedule's operations stay the
ROTOR vocabulary -- and follow from the order of its computations (``F_*`` and ``B``, transfers left out):

* The loss (stage L+1) is run outside the executor: it is no computation here, so the weights of the
  stage computing before it stay on the device through it, and no copy starts or is retired at it.
* **In.** A computation on a stage ``l`` in S needs W_l (its parameters) on the device. As each
  computation starts, the parameters of the next *run* of computations on a streamed stage (the next
  position where the stage changes to one in S) start copying in (host to device), unless they are on the
  device already; so the copy overlaps every computation between the previous streamed run and that one,
  not only the last. A run at the schedule's first computation fetches its own on demand. The compute
  stream waits for the copy's end before the run starts. At most two parameter sets are on the device: the
  running stage's and the next streamed one's.
* **Out.** W_l is dropped after the last of a run of consecutive computations on ``l`` (nothing is copied
  back: the host keeps the master copy).
* **Gradients.** ``B(l)`` of a streamed stage writes G_l (its parameter gradients) on the device; they are
  not kept there (``weight_grad_bytes`` is not carried past ``B(l)``) but copied out (device to host) as
  ``B(l)`` ends, counted on the device through the next computation, and retired before the one after
  (the compute stream waits for the copy there). The host adds them to its gradients.
* Copies queue on the two copy engines of :class:`planner.simulation.streams.CopyStreams`, shared with activation
  offloads and prefetches, so a weight copy and an activation copy in one direction run one after the
  other. The makespan includes the last gradient's copy (the host's optimizer step needs it).
* Device memory during a computation: what the activation rules say, plus the parameters on the device
  (the stage computing and the next one arriving) plus gradients in flight out. Host memory: the streamed
  stages' parameters, gradients and optimizer state, all the time.

The executor (:mod:`planner.executor.weights`) issues its copies at the same points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.simulation.streams import CopyStreams


def next_runs(sequence: Sequence[int], streamed: frozenset[int] | set[int]) -> list[int | None]:
    """For each computation, the stage of the next run on a streamed stage after it (``None``: none).

    A run starts where the stage changes; the run the computation belongs to does not count.
    """
    out: list[int | None] = [None] * len(sequence)
    upcoming: int | None = None
    for index in range(len(sequence) - 1, -1, -1):
        out[index] = upcoming
        stage = sequence[index]
        if stage in streamed and (index == 0 or sequence[index - 1] != stage):
            upcoming = stage
    return out


class WeightStreams:
    """The streamed weights during one replay: which are on the device, and the gradients on their way out.

    Args:
        chain: the chain (with :attr:`planner.model.chain.Chain.weights`).
        streams: the replay's clock and copy engines.
        streamed: the stages whose weights are streamed.
        compute_stages: the stage of each computation of the schedule, in order (transfers and the loss
            left out: the executor does not run the loss, so the weights of stage L stay through it).
    """

    def __init__(self, chain: Chain, streams: CopyStreams, streamed: frozenset[int],
                 compute_stages: Sequence[int]) -> None:
        assert chain.weights is not None, "streamed weights need chain.weights (checked by the caller)"
        self.chain, self.weights, self.streams = chain, chain.weights, streams
        self.streamed, self.sequence = streamed, list(compute_stages)
        self.index = 0
        self.upcoming = next_runs(self.sequence, streamed)
        self.arriving: dict[int, float] = {}  # stage -> end of its parameters' copy in (they are on the device)
        self.leaving: list[tuple[int, float, int]] = []  # (bytes, copy end, index of the B that wrote them)
        self.host_bytes = self.weights.host_bytes(streamed)
        self.end_ms = 0.0

    def enter(self, op: Op) -> int:
        """Before computation ``op``: retires gradients due, waits for its parameters, starts the next
        stage's. Returns what streaming adds to the device during it."""
        streams, stage = self.streams, op.stage
        if stage > self.chain.length:  # the loss: run outside the executor, no copy starts or ends here
            return self.held_bytes
        due = [item for item in self.leaving if item[2] < self.index - 1]
        for _, end, _ in due:
            streams.wait(end)
        self.leaving = [item for item in self.leaving if item[2] >= self.index - 1]
        if stage in self.streamed:
            if stage not in self.arriving:  # nothing ran before it to overlap: fetched on demand
                self.arriving[stage] = streams.copy_h2d(self.weights.params(stage), streams.clock_ms)[1]
            streams.wait(self.arriving[stage])
        upcoming = self.upcoming[self.index]
        if upcoming is not None and upcoming not in self.arriving:
            self.arriving[upcoming] = streams.copy_h2d(self.weights.params(upcoming), streams.clock_ms)[1]
        extra = self.held_bytes
        if op.kind is OpKind.B and stage in self.streamed:  # G_l is written on the device, not kept there
            extra += self.weights.grads(stage) - self.chain.stage(stage).weight_grad_bytes
        return extra

    def leave(self, op: Op, memory: Any) -> None:
        """After computation ``op`` (``memory``: the simulator's, whose ``live`` loses kept gradients)."""
        stage = op.stage
        if stage > self.chain.length:
            return
        if op.kind is OpKind.B and stage in self.streamed:
            memory.live -= self.chain.stage(stage).weight_grad_bytes
            size = self.weights.grads(stage)
            end = self.streams.copy_d2h(size, self.streams.clock_ms)[1]
            self.leaving.append((size, end, self.index))
            self.end_ms = max(self.end_ms, end)
        following = self.sequence[self.index + 1] if self.index + 1 < len(self.sequence) else None
        if stage in self.streamed and following != stage:
            del self.arriving[stage]
        self.index += 1

    @property
    def held_bytes(self) -> int:
        """Device memory streamed weights hold now: parameters on the device, gradients in flight out."""
        return sum(self.weights.params(s) for s in self.arriving) + sum(size for size, _, _ in self.leaving)
