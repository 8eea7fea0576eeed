"""What a training step holds around a chain, measured from the trace's timeline.

The profiled run is a store-all run, so its timeline splits at the chain's boundaries into parts no
schedule changes and the chain's span, which the simulator replays (see :mod:`planner.model.step`):

* before the chain: from the iteration's start to the forward of stage 1 (its peak: ``before_peak``);
* at stage 1's forward, what is allocated besides the chain's input is ``base`` (model state, batch,
  activations of the modules before the chain, side inputs);
* from the end of stage L's forward to the start of its backward the modules after the chain (head, loss)
  run forward and backward: they become the chain's loss stage (what they hold, their transient peaks,
  the parameter gradients their backward leaves);
* after stage 1's backward: the backward of the modules before the chain and the optimizer step
  (``after_peak``).

Every size is a difference of allocator readings at those boundaries, so what the chain's cost model
does not see elsewhere in the step is still counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from memprof.phases import Phase
from planner.model.chain import Stage
from planner.model.step import StepCosts

_STATE = ("weights", "buffers", "optimizer_state", "weight_grads")


class Timeline:
    """One iteration's ``events`` rows, indexed once for the lookups below (shared by every candidate chain).

    Attributes:
        rows: the rows indexed by ``seq``, in order.
        forward_enter, forward_exit: ``seq`` of each module's first forward enter and exit.
        backward_enter: ``seq`` of each module's first backward enter.
    """

    def __init__(self, events: pd.DataFrame) -> None:
        self.rows = events.sort_values("seq").set_index("seq")
        rows = self.rows
        forward = rows[rows.phase == Phase.FORWARD]
        self._forward_seqs = forward.index.to_numpy()
        self.forward_enter = _first(forward[forward.event == "enter"])
        self.forward_exit = _first(forward[forward.event == "exit"])
        self.backward_enter = _first(rows[(rows.phase == Phase.BACKWARD) & (rows.event == "enter")])
        self.names = set(rows.module)

    def subtree(self, modules: Iterable[str]) -> set[str]:
        """The names of ``modules`` and every module below them that appear in the timeline."""
        prefixes = tuple(f"{m}." for m in modules)
        wanted = set(modules)
        return {n for n in self.names if n in wanted or n.startswith(prefixes)}

    def backward_enters(self, modules: Iterable[str]) -> list[int]:
        """``seq`` of the first backward enter of every module in ``modules``' subtrees, sorted."""
        return sorted(self.backward_enter[n] for n in self.subtree(modules) if n in self.backward_enter)

    def peak(self, after: int, upto: int | None = None) -> int | None:
        """The highest ``peak_bytes`` of the rows after ``after`` up to ``upto`` (inclusive; ``None``: the end)."""
        window = self.rows.loc[after + 1 : upto] if upto is not None else self.rows.loc[after + 1 :]
        return int(window.peak_bytes.max()) if not window.empty else None

    def allocated(self, seq: int) -> int:
        """``allocated_bytes`` right after row ``seq``."""
        return int(self.rows.at[seq, "allocated_bytes"])

    def next_forward(self, seq: int) -> int | None:
        """The first forward row after ``seq``."""
        position = int(np.searchsorted(self._forward_seqs, seq, side="right"))
        return int(self._forward_seqs[position]) if position < len(self._forward_seqs) else None


def _first(rows: pd.DataFrame) -> dict[str, int]:
    return {module: int(seq) for seq, module in zip(rows.index[::-1], rows.module[::-1])}


@dataclass(frozen=True)
class Boundaries:
    """Row positions (in one iteration's events, by ``seq``) of the chain's boundaries."""

    chain_start: int  # forward enter of stage 1
    chain_end: int  # forward exit of stage L
    forward_end: int  # last forward row
    last_backward: int  # backward enter of stage L
    first_backward_end: int  # first backward row after stage 1's backward


def boundaries(timeline: Timeline, first: tuple[str, ...], last: tuple[str, ...]) -> Boundaries | None:
    """Finds the boundaries of a chain whose first stage runs ``first`` and last stage ``last``.

    Returns ``None`` when the iteration lacks one of them (no backward, a failed step).
    """
    start, end = timeline.forward_enter.get(first[0]), timeline.forward_exit.get(last[-1])
    tops, bottoms = timeline.backward_enters(last), timeline.backward_enters(first)
    if start is None or end is None or not tops or not bottoms:
        return None
    rows = timeline.rows.loc[bottoms[-1] + 1 :]
    inside = timeline.subtree(first)
    after = rows[(rows.phase == Phase.BACKWARD) & rows.event.isin(["enter", "end"]) & ~rows.module.isin(inside)]
    tail = rows[rows.phase != Phase.BACKWARD]
    close = int(after.index[0]) if not after.empty else (int(tail.index[0]) if not tail.empty else
                                                          int(timeline.rows.index[-1]))
    return Boundaries(start, end, int(timeline._forward_seqs[-1]), tops[0], close)


def measure(timeline: Timeline, bounds: Boundaries, input_bytes: int, grad_bytes: int,
            chain_held_bytes: int) -> tuple[StepCosts, Stage]:
    """The step costs around a chain and its loss stage (head and loss), from one iteration's events.

    Args:
        timeline: one iteration's events.
        bounds: the chain's boundaries in them.
        input_bytes: a^0, the chain's input.
        grad_bytes: delta^L, the gradient with respect to the chain's output.
        chain_held_bytes: the a-bars of stages 1..L together: what store-all's chain holds besides a^0 once
            its last stage's forward is over, by the chain's own costs.
    """
    ev = timeline.rows
    start = ev.loc[bounds.chain_start]
    base = max(int(start.allocated_bytes) - input_bytes, 0)
    state = min(sum(int(start[c]) for c in _STATE), base)
    inputs = min(int(start.inputs), base - state)
    optimizer = ev[ev.phase == Phase.OPTIMIZER]
    step_bytes = optimizer_peak = 0
    if not optimizer.empty:
        optimizer_peak = int(optimizer.peak_bytes.max())
        step_bytes = max(optimizer_peak - int(optimizer.allocated_bytes.iloc[0]), 0)
    costs = StepCosts(
        model_state_bytes=state,
        inputs_bytes=inputs,
        outside_bytes=base - state - inputs,
        before_peak_bytes=int(ev.loc[: bounds.chain_start].peak_bytes.max()),
        after_peak_bytes=int(ev.loc[bounds.first_backward_end :].peak_bytes.max()),
        optimizer_step_bytes=step_bytes,
        weights_bytes=int(start.weights) + int(start.buffers),
        optimizer_state_bytes=int(max(start.optimizer_state, ev.iloc[-1].optimizer_state)),
        weight_grad_bytes=int(ev.weight_grads.max()),
        optimizer_peak_bytes=optimizer_peak,
    )
    return costs, _loss_stage(timeline, bounds, grad_bytes, int(start.allocated_bytes) + chain_held_bytes)


def _loss_stage(timeline: Timeline, bounds: Boundaries, grad_bytes: int, chain_out: int) -> Stage:
    """The modules after the chain and the loss, as the chain's stage L+1 (``F_all(L+1)`` then ``B(L+1)``).

    Its sizes are measured above ``chain_out``, what the simulator holds after store-all's ``F_all(L)`` (the
    step's base, a^0 and every a-bar), not above the allocator's reading at stage L's exit: what the stage's
    caller frees after it returns (a Sequential drops the last Linear's output, which a Tanh did not save) is
    in that reading and not in the chain's costs, and what a block returns beside its output may be in both.
    So store-all's replay of the loss is the profiled step's, to the byte.
    """
    held = max(timeline.allocated(bounds.forward_end) - chain_out, 0)
    forward_peak = timeline.peak(bounds.chain_end, bounds.forward_end)
    backward_peak = timeline.peak(bounds.forward_end, bounds.last_backward)
    weight_grads = max(timeline.allocated(bounds.last_backward) - chain_out - grad_bytes, 0)
    times = timeline.rows.time_ns
    forward_ms = (int(times[bounds.forward_end]) - int(times[bounds.chain_end])) / 1e6
    backward_ms = (int(times[bounds.last_backward]) - int(times[bounds.forward_end])) / 1e6
    return Stage(
        forward_ms=max(forward_ms, 0.0),
        backward_ms=max(backward_ms, 0.0),
        output_bytes=0,
        saved_bytes=held,
        grad_bytes=0,
        forward_overhead_bytes=max((forward_peak or chain_out + held) - chain_out - held, 0),
        backward_overhead_bytes=max((backward_peak or chain_out) - chain_out - held - grad_bytes - weight_grads, 0),
        name="loss",
        weight_grad_bytes=weight_grads,
    )


def calibrated(stages: list[Stage], timeline: Timeline, groups: tuple[tuple[str, ...], ...],
               input_bytes: int) -> list[Stage]:
    """``stages`` with their overheads read from the store-all timeline around each stage.

    ``o_f`` is the peak during the stage's forward above what was allocated before it plus what it kept
    (a-bar); ``o_b`` the peak during its backward (up to the next stage's backward) above what was allocated
    before it plus the input gradient and the parameter gradients it leaves. Stages whose windows are not
    all in the timeline keep their per-module estimates.
    """
    enters = [next(iter(timeline.backward_enters(group)), None) for group in groups]
    known = [e for e in enters if e is not None]
    rows = timeline.rows
    tail = rows.loc[max(known, default=0) + 1 :]
    tail = tail[tail.phase != Phase.BACKWARD]
    closing = int(tail.index[0]) if not tail.empty else None
    out = []
    for index, (stage, group) in enumerate(zip(stages, groups)):
        updates: dict[str, Any] = {}
        start, end = timeline.forward_enter.get(group[0]), timeline.forward_exit.get(group[-1])
        if start is not None and end is not None and end > start:
            peak = timeline.peak(start, end)
            if peak is not None:  # rows start+1..end exist (end > start)
                updates["forward_overhead_bytes"] = max(peak - timeline.allocated(start) - stage.saved_bytes, 0)
        below, enter = enters[index - 1] if index > 0 else closing, enters[index]
        if enter is not None and below is not None and below > enter:
            peak = timeline.peak(enter, below)
            grad_in = input_bytes if index == 0 else stages[index - 1].grad_bytes
            if peak is not None:  # rows enter+1..below exist (below > enter)
                updates["backward_overhead_bytes"] = max(
                    peak - timeline.allocated(enter) - grad_in - stage.weight_grad_bytes, 0)
        out.append(replace(stage, **updates))
    return out


def fuse_freed_outputs(groups: tuple[tuple[str, ...], ...], timeline: Timeline, output_bytes: dict[str, int],
                       separate: frozenset[str] = frozenset()) -> tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]:
    """Joins a stage to the next when plain autograd frees its output during the forward.

    A stage's output is a checkpoint only if it outlives the next stage's forward (the next stage saved it, as
    a Linear or a LayerNorm saves its input). When it does not (a Linear followed by a ReLU, which saves only
    its own output), the timeline shows it: allocated memory drops by that output once the next stage has
    returned. Such a pair is one stage, whose saved memory does not count the freed output.

    A group whose first module is in ``separate`` (it reads tensors carried from earlier stages, which only
    the stage's first module receives) always starts a stage.

    Returns:
        The stage groups, and per group the bytes of the outputs freed inside it.
    """
    fused: list[list[str]] = [list(groups[0])]
    freed = [0]
    for group in groups[1:]:
        size = output_bytes.get(fused[-1][-1], 0)
        exit_seq = timeline.forward_exit.get(group[-1])
        after = timeline.next_forward(exit_seq) if exit_seq is not None else None
        drop = timeline.allocated(exit_seq) - timeline.allocated(after) if exit_seq is not None and after is not None else 0
        if size > 0 and drop >= size and group[0] not in separate:
            fused[-1] += list(group)
            freed[-1] += size
        else:
            fused.append(list(group))
            freed.append(0)
    return tuple(tuple(g) for g in fused), tuple(freed)
