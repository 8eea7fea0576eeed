"""The simulator's clock: computation on one stream, offloads and prefetches on one copy stream each.

The rules (tensor streaming with synchronised migration, the executor's behaviour on CUDA):

* Computations (``F_*``, ``B``) run one after another on the compute stream, each for its ``u_f`` or
  ``u_b``.
* ``OFFLOAD(l)`` and ``PREFETCH(l)`` take no compute time: each starts a copy of a-bar^l - a^l on its
  direction's copy stream (device-to-host, host-to-device; the two run at once, as a GPU's two copy
  engines do) at the moment it is issued, for ``bytes / bandwidth`` ms, overlapping the computations that
  follow.
* One copy is in flight per direction. A copy is *retired* -- the compute stream waits for its end if it
  has not ended, and its memory effect is applied -- at the first of these points:

  - an offload: when the next ``OFFLOAD`` is issued, before any ``B``, before any operation on the loss
    (stage L+1: the executor does not run the loss, so the chain's forward ends there), and before a
    ``PREFETCH`` of the same stage. Its device memory is freed when it is retired;
  - a prefetch: when the next ``PREFETCH`` is issued and before ``B(l)`` of its stage (which needs it).
    Its device memory is allocated when it is issued; the host buffer is returned when it is retired.

  Retiring at these points rather than at the copy's end makes memory a function of the operations'
  order alone -- the executor releases an offloaded tensor when it has waited for its copy, not whenever
  the copy engine happens to finish -- so predicted device memory holds whatever the real bandwidth is.
* The makespan is the time the last operation ends: computations, plus every wait for a copy.

So a step takes, per stretch between two retirements, the longer of its computation and its copy: a copy
that fits beside the computation costs nothing. Host memory holds a stage's offloaded bytes from its
``OFFLOAD`` to the retirement of its ``PREFETCH``; it must stay within the chain's host cap.
"""

from __future__ import annotations

from typing import Protocol

from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind


class TransferMemory(Protocol):
    """What the clock asks of the simulator's memory when a copy starts or is retired."""

    def offload(self, stage: int) -> None: ...

    def release(self, stage: int) -> tuple[tuple[str, ...], tuple[str, ...]]: ...

    def prefetch(self, stage: int) -> tuple[tuple[str, ...], tuple[str, ...]]: ...

    def arrive(self, stage: int) -> None: ...


class CopyStreams:
    """The compute clock and the copy in flight in each direction, for one replay.

    Attributes:
        clock_ms: when the next operation can be issued (the compute stream's end so far).
        out: ``(stage, end_ms)`` of the offload in flight, or ``None``.
        back: ``(stage, end_ms)`` of the prefetch in flight, or ``None``.
    """

    __slots__ = ("chain", "memory", "costs", "clock_ms", "out", "back", "top", "d2h_free_ms", "h2d_free_ms")

    def __init__(self, chain: Chain, memory: TransferMemory) -> None:
        self.chain, self.memory, self.costs = chain, memory, chain.transfer_costs
        self.clock_ms = 0.0
        self.out: tuple[int, float] | None = None
        self.back: tuple[int, float] | None = None
        self.top = chain.length + 1
        # when each copy engine is next free: weight streaming (planner.simulation.weight_streams) queues its copies on
        # the same engines, so an activation's copy may start after a weight copy ends
        self.d2h_free_ms = 0.0
        self.h2d_free_ms = 0.0

    def before(self, op: Op) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Retires the copies ``op`` must wait for; returns the names that retiring added and freed."""
        kind = op.kind
        added: tuple[str, ...] = ()
        freed: tuple[str, ...] = ()
        if self.out is not None and (
            kind is OpKind.OFFLOAD or kind is OpKind.B or op.stage == self.top
            or (kind is OpKind.PREFETCH and self.out[0] == op.stage)
        ):
            added, freed = self._retire_out()
        if self.back is not None and (kind is OpKind.PREFETCH or (kind is OpKind.B and self.back[0] == op.stage)):
            self._retire_back()
        return added, freed

    def issue(self, op: Op) -> tuple[float, float, tuple[str, ...], tuple[str, ...]]:
        """Starts the copy of a transfer op (after :meth:`before`); returns its start, end, added and freed names."""
        size = self.chain.offload_bytes(op.stage)
        added: tuple[str, ...] = ()
        freed: tuple[str, ...] = ()
        if op.kind is OpKind.OFFLOAD:
            self.memory.offload(op.stage)
            start, end = self.copy_d2h(size, self.clock_ms)
            self.out = (op.stage, end)
        else:
            added, freed = self.memory.prefetch(op.stage)
            start, end = self.copy_h2d(size, self.clock_ms)
            self.back = (op.stage, end)
        return start, end, added, freed

    def copy_d2h(self, size_bytes: int, ready_ms: float) -> tuple[float, float]:
        """Queues a device-to-host copy that may start at ``ready_ms``; returns its start and end."""
        start = max(ready_ms, self.d2h_free_ms)
        self.d2h_free_ms = start + self.costs.d2h_ms(size_bytes)
        return start, self.d2h_free_ms

    def copy_h2d(self, size_bytes: int, ready_ms: float) -> tuple[float, float]:
        """Queues a host-to-device copy that may start at ``ready_ms``; returns its start and end."""
        start = max(ready_ms, self.h2d_free_ms)
        self.h2d_free_ms = start + self.costs.h2d_ms(size_bytes)
        return start, self.h2d_free_ms

    def wait(self, end_ms: float) -> None:
        """The compute stream waits for a copy that ends at ``end_ms``."""
        self.clock_ms = max(self.clock_ms, end_ms)

    def compute(self, duration_ms: float) -> tuple[float, float]:
        """Runs a computation of ``duration_ms`` now; returns its start and end."""
        start = self.clock_ms
        self.clock_ms = start + duration_ms
        return start, self.clock_ms

    def _retire_out(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        assert self.out is not None
        stage, end = self.out
        self.clock_ms = max(self.clock_ms, end)
        self.out = None
        return self.memory.release(stage)

    def _retire_back(self) -> None:
        assert self.back is not None
        stage, end = self.back
        self.clock_ms = max(self.clock_ms, end)
        self.back = None
        self.memory.arrive(stage)
