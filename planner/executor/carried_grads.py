"""The gradients of carried tensors (skips, an encoder's output read by every decoder block), added up as plain
autograd adds them.

Plain autograd adds the parts of a tensor's gradient one at a time, in backward order, in its producer's
buffer. Each stage's backward here is a nested call: summing a block's own parts there and then the blocks'
in the outer backward would group the additions differently, and round differently when a block reads the
tensor twice (T5's decoder blocks project the encoder's output into keys and values). So a recording reads
a carried tensor through a view of a leaf; ``B(l)`` of the last reader leaves the sum of its parts on the
leaf; each earlier reader's ``B`` starts its view's buffer from the sum so far (an extra root of its
backward); and only the first reader hands the total to autograd.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class CarriedGrads:
    """One forward call's carried tensors, keyed by identity, and their gradients so far."""

    def __init__(self) -> None:
        self.first: dict[int, tuple[torch.Tensor, int]] = {}  # key -> (tensor, its first reader in forward order)
        self.keys: dict[int, list[int]] = {}  # stage -> the key of each carried place
        self.recorded: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}  # stage -> key -> (leaf, view)
        self.sums: dict[int, torch.Tensor] = {}  # key -> the gradient summed over the readers whose B ran
        self.handed: dict[int, list[torch.Tensor | None]] = {}  # stage -> what its function hands autograd

    def carry(self, stage: int, carried: Sequence[torch.Tensor]) -> None:
        """Notes the tensors stage ``stage`` carries (before its first forward)."""
        self.keys[stage] = [id(t) for t in carried]
        for tensor in carried:
            self.first.setdefault(id(tensor), (tensor, stage))  # held: its id stays its own until it is done

    def views(self, stage: int, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """What a recording of ``stage`` reads in its carried places (``values``: the carried tensors without
        history): one view of a fresh leaf per tensor, a tensor in two places read through one view."""
        made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, value in zip(self.keys[stage], values):
            if key not in made:
                leaf = value.detach().requires_grad_(True)
                made[key] = (leaf, leaf.view_as(leaf))
        self.recorded[stage] = made
        return [made[key][1] for key in self.keys[stage]]

    def seeds(self, stage: int) -> list[tuple[Any, torch.Tensor]]:
        """(view, gradient so far) of each carried tensor of ``stage`` that a later reader's B already reached:
        roots of ``B(stage)``'s backward, so the view's buffer starts from them."""
        made = self.recorded.get(stage, {})
        return [(view, self.sums.pop(key)) for key, (_, view) in made.items() if key in self.sums]

    def hand_over(self, stage: int) -> bool:
        """After ``B(stage)``: notes the gradient for each carried place that the stage's function hands
        autograd (the total from the first reader, ``None`` elsewhere; :meth:`take`); whether the stage had
        recorded any."""
        made = self.recorded.pop(stage, None)
        if made is None:
            return False
        handed: list[torch.Tensor | None] = []
        for key in self.keys[stage]:
            grad = made.pop(key)[0].grad if key in made else None  # a tensor in two places: handed over once
            if grad is not None and self.first[key][1] != stage:
                self.sums[key] = grad
                grad = None
            handed.append(grad)
        for key in self.keys.pop(stage):
            if self.first.get(key, (None, 0))[1] == stage:
                del self.first[key]  # its first reader is done: the tensor may go
        self.handed[stage] = handed
        return True

    def take(self, stage: int, count: int) -> list[torch.Tensor | None]:
        """The gradients the function of ``stage`` (``count`` carried inputs) hands autograd, once."""
        return self.handed.pop(stage, [None] * count)

    def clear(self) -> None:
        """Forgets the call (its backward is over); what stage 1's function has yet to hand over stays for
        :meth:`take`."""
        self.first.clear()
        self.keys.clear()
        self.recorded.clear()
        self.sums.clear()
