"""One forward call's offloads and prefetches, retired where the simulator retires them (:mod:`planner.simulation.streams`).

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling modules, which
``planner.export.files`` embeds together in the files it writes).
"""

from __future__ import annotations

from typing import Any

import torch

from planner.executor.offload import Copier, HostPool, Stash, storage_key


class Transfers:
    """One forward call's stashes and the copy in flight each way, retired where :mod:`planner.simulation.streams` says.

    Args:
        pool: the executor's host buffers (kept across steps).
        copiers: the executor's side streams by device (kept across steps).
        min_bytes: storages below this size stay on the device.
    """

    def __init__(self, pool: HostPool, copiers: dict[torch.device, Copier], min_bytes: int) -> None:
        self.pool, self.copiers, self.min_bytes = pool, copiers, min_bytes
        self.stashes: dict[int, Stash] = {}
        self.out: int | None = None  # the stage whose offload is in flight
        self.back: int | None = None  # the stage whose prefetch is in flight

    def recording(self, stage: int, x: torch.Tensor, modules: Any, others: Any, wrap: Any = None) -> Any:
        """The hooks to record stage ``stage`` under: its saved tensors go to a new stash.

        ``modules`` are the stage's modules (their parameters and buffers stay), ``others`` the side inputs;
        ``wrap(inner)``, when given, turns the stash's ``(pack, unpack)`` into the hooks to use (streamed weights).
        """
        old = self.stashes.pop(stage, None)
        if old is not None:
            old.discard()
        kept = {storage_key(t) for m in modules for t in (*m.parameters(), *m.buffers())}
        kept.update(storage_key(t) for t in others)
        kept.add(storage_key(x))
        copier = self.copiers.get(x.device)
        if copier is None:
            copier = self.copiers[x.device] = Copier(x.device)
        stash = self.stashes[stage] = Stash(self.pool, copier, x.device, self.min_bytes, kept)
        hooks = (stash.pack, stash.unpack) if wrap is None else wrap((stash.pack, stash.unpack))
        return torch.autograd.graph.saved_tensors_hooks(*hooks)

    def recorded(self, stage: int, outputs: Any) -> None:
        """The stage's outputs stay on the device (the schedule keeps them): never offloaded."""
        self.stashes[stage].keep(outputs)

    def offload(self, stage: int) -> None:
        """``OFFLOAD(stage)``: retires the offload in flight, starts this one."""
        self.retire_out()
        self.stashes[stage].offload()
        self.out = stage

    def prefetch(self, stage: int) -> None:
        """``PREFETCH(stage)``: retires its own offload if still in flight and the prefetch in flight."""
        if self.out == stage:
            self.retire_out()
        self.retire_back()
        self.stashes[stage].prefetch()
        self.back = stage

    def before_backward(self, stage: int) -> None:
        """Before ``B(stage)``: every offload is retired, and the prefetch of this stage."""
        self.retire_out()
        if self.back == stage:
            self.retire_back()

    def retire_out(self) -> None:
        """Waits for the offload in flight and frees the device memory it copied."""
        if self.out is not None:
            self.stashes[self.out].release()
            self.out = None

    def retire_back(self) -> None:
        """Makes the prefetch in flight usable and returns its host buffers."""
        if self.back is not None:
            self.stashes[self.back].arrive()
            self.back = None

    def done(self, stage: int) -> None:
        """After ``B(stage)``: the stage's stash is dropped (its device copies are freed with the graph)."""
        stash = self.stashes.pop(stage, None)
        if stash is not None:
            stash.discard()

    def clear(self) -> None:
        """The step is over: every host buffer still held goes back."""
        self.out = self.back = None
        for stash in self.stashes.values():
            stash.discard()
        self.stashes.clear()
