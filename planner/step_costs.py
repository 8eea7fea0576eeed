"""What a training step holds around a chain, measured from the trace's timeline.

The profiled run is a store-all run, so its timeline splits at the chain's boundaries into parts no
schedule changes and the chain's span, which the simulator replays (see :mod:`planner.step`):

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

import pandas as pd

from planner.chain import Stage
from planner.step import StepCosts

_STATE = ("weights", "buffers", "optimizer_state", "weight_grads")


@dataclass(frozen=True)
class Boundaries:
    """Row positions (in one iteration's events, by ``seq``) of the chain's boundaries."""

    chain_start: int  # forward enter of stage 1
    chain_end: int  # forward exit of stage L
    forward_end: int  # last forward row
    last_backward: int  # backward enter of stage L
    first_backward_end: int  # first backward row after stage 1's backward


def _subtree(modules: Iterable[str], names: Iterable[str]) -> set[str]:
    prefixes = tuple(f"{m}." for m in modules)
    wanted = set(modules)
    return {n for n in names if n in wanted or n.startswith(prefixes)}


def boundaries(events: pd.DataFrame, first: tuple[str, ...], last: tuple[str, ...]) -> Boundaries | None:
    """Finds the boundaries of a chain whose first stage runs ``first`` and last stage ``last``.

    Returns ``None`` when the iteration lacks one of them (no backward, a failed step).
    """
    ev = events.sort_values("seq")
    names = set(ev.module)
    first_set, last_set = _subtree(first, names), _subtree(last, names)
    forward = ev[ev.phase == "forward"]
    backward = ev[ev.phase == "backward"]
    starts = forward[(forward.module == first[0]) & (forward.event == "enter")]
    ends = forward[(forward.module == last[-1]) & (forward.event == "exit")]
    tops = backward[backward.module.isin(last_set) & (backward.event == "enter")]
    bottoms = backward[backward.module.isin(first_set) & (backward.event == "enter")]
    if starts.empty or ends.empty or tops.empty or bottoms.empty or forward.empty:
        return None
    after = backward[(backward.seq > bottoms.seq.max()) & ~backward.module.isin(first_set)
                     & (backward.event.isin(["enter", "end"]))]
    tail = ev[(ev.seq > bottoms.seq.max()) & (ev.phase != "backward")]
    close = int(after.seq.min()) if not after.empty else (int(tail.seq.min()) if not tail.empty else int(ev.seq.max()))
    return Boundaries(int(starts.seq.iloc[0]), int(ends.seq.iloc[0]), int(forward.seq.max()),
                      int(tops.seq.min()), close)


def measure(events: pd.DataFrame, bounds: Boundaries, input_bytes: int, grad_bytes: int) -> tuple[StepCosts, Stage]:
    """The step costs around a chain and its loss stage (head and loss), from one iteration's events.

    Args:
        events: one iteration's ``events`` rows.
        bounds: the chain's boundaries in them.
        input_bytes: a^0, the chain's input.
        grad_bytes: delta^L, the gradient with respect to the chain's output.
    """
    ev = events.set_index("seq").sort_index()
    at = ev.loc
    start = at[bounds.chain_start]
    base = max(int(start.allocated_bytes) - input_bytes, 0)
    state = min(sum(int(start[c]) for c in _STATE), base)
    inputs = min(int(start.inputs), base - state)
    before_peak = int(ev.loc[: bounds.chain_start].peak_bytes.max())
    after_peak = int(ev.loc[bounds.first_backward_end :].peak_bytes.max())
    optimizer = ev[ev.phase == "optimizer"]
    step_bytes = optimizer_peak = 0
    if not optimizer.empty:
        optimizer_peak = int(optimizer.peak_bytes.max())
        step_bytes = max(optimizer_peak - int(optimizer.allocated_bytes.iloc[0]), 0)
    end = ev.iloc[-1]
    costs = StepCosts(
        model_state_bytes=state,
        inputs_bytes=inputs,
        outside_bytes=base - state - inputs,
        before_peak_bytes=before_peak,
        after_peak_bytes=after_peak,
        optimizer_step_bytes=step_bytes,
        weights_bytes=int(start.weights) + int(start.buffers),
        optimizer_state_bytes=int(max(start.optimizer_state, end.optimizer_state)),
        weight_grad_bytes=int(ev.weight_grads.max()),
        optimizer_peak_bytes=optimizer_peak,
    )
    return costs, _loss_stage(ev, bounds, grad_bytes)


def _loss_stage(ev: pd.DataFrame, bounds: Boundaries, grad_bytes: int) -> Stage:
    """The modules after the chain and the loss, as the chain's stage L+1 (``F_all(L+1)`` then ``B(L+1)``)."""
    chain_out = int(ev.loc[bounds.chain_end].allocated_bytes)
    held = max(int(ev.loc[bounds.forward_end].allocated_bytes) - chain_out, 0)
    head = ev.loc[bounds.chain_end : bounds.forward_end].iloc[1:]
    forward_peak = int(head.peak_bytes.max()) if not head.empty else chain_out + held
    loss = ev.loc[bounds.forward_end : bounds.last_backward].iloc[1:]
    backward_peak = int(loss.peak_bytes.max()) if not loss.empty else chain_out
    left = int(ev.loc[bounds.last_backward].allocated_bytes) - chain_out
    weight_grads = max(left - grad_bytes, 0)
    forward_ms = (int(ev.loc[bounds.forward_end].time_ns) - int(ev.loc[bounds.chain_end].time_ns)) / 1e6
    backward_ms = (int(ev.loc[bounds.last_backward].time_ns) - int(ev.loc[bounds.forward_end].time_ns)) / 1e6
    return Stage(
        forward_ms=max(forward_ms, 0.0),
        backward_ms=max(backward_ms, 0.0),
        output_bytes=0,
        saved_bytes=held,
        grad_bytes=0,
        forward_overhead_bytes=max(forward_peak - chain_out - held, 0),
        backward_overhead_bytes=max(backward_peak - chain_out - held - grad_bytes - weight_grads, 0),
        name="loss",
        weight_grad_bytes=weight_grads,
    )


def calibrated(stages: list[Stage], events: pd.DataFrame, groups: tuple[tuple[str, ...], ...],
               input_bytes: int) -> list[Stage]:
    """``stages`` with their overheads read from the store-all timeline around each stage.

    ``o_f`` is the peak during the stage's forward above what was allocated before it plus what it kept
    (a-bar); ``o_b`` the peak during its backward (up to the next stage's backward) above what was allocated
    before it plus the input gradient and the parameter gradients it leaves. Stages whose windows are not
    all in the timeline keep their per-module estimates.
    """
    ev = events.sort_values("seq")
    names = set(ev.module)
    forward, backward = ev[ev.phase == "forward"], ev[ev.phase == "backward"]
    enters = []
    for group in groups:
        rows = backward[backward.module.isin(_subtree(group, names)) & (backward.event == "enter")]
        enters.append(int(rows.seq.min()) if not rows.empty else None)
    closing = ev[(ev.phase != "backward") & (ev.seq > max((e for e in enters if e is not None), default=0))]
    out = []
    for index, (stage, group) in enumerate(zip(stages, groups)):
        start = forward[(forward.module == group[0]) & (forward.event == "enter")]
        end = forward[(forward.module == group[-1]) & (forward.event == "exit")]
        updates = {}
        if not start.empty and not end.empty:
            window = ev[(ev.seq > start.seq.iloc[0]) & (ev.seq <= end.seq.iloc[0])]
            before = int(start.allocated_bytes.iloc[0])
            updates["forward_overhead_bytes"] = max(int(window.peak_bytes.max()) - before - stage.saved_bytes, 0)
        below = enters[index - 1] if index > 0 else (int(closing.seq.min()) if not closing.empty else None)
        if enters[index] is not None and below is not None and below > enters[index]:
            window = ev[(ev.seq > enters[index]) & (ev.seq <= below)]
            before = int(ev[ev.seq == enters[index]].allocated_bytes.iloc[0])
            grad_in = input_bytes if index == 0 else stages[index - 1].grad_bytes
            updates["backward_overhead_bytes"] = max(
                int(window.peak_bytes.max()) - before - grad_in - stage.weight_grad_bytes, 0)
        out.append(replace(stage, **updates))
    return out


def fuse_freed_outputs(groups: tuple[tuple[str, ...], ...], events: pd.DataFrame,
                       output_bytes: dict[str, int]) -> tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]:
    """Joins a stage to the next when plain autograd frees its output during the forward.

    A stage's output is a checkpoint only if it outlives the next stage's forward (the next stage saved it, as
    a Linear or a LayerNorm saves its input). When it does not (a Linear followed by a ReLU, which saves only
    its own output), the timeline shows it: allocated memory drops by that output once the next stage has
    returned. Such a pair is one stage, whose saved memory does not count the freed output.

    Returns:
        The stage groups, and per group the bytes of the outputs freed inside it.
    """
    ev = events[events.phase == "forward"].sort_values("seq")
    exits = ev[ev.event == "exit"].drop_duplicates("module").set_index("module")
    fused: list[list[str]] = [list(groups[0])]
    freed = [0]
    for group in groups[1:]:
        before = fused[-1][-1]
        row = exits.loc[group[-1]] if group[-1] in exits.index else None
        after = ev[ev.seq > row.seq] if row is not None else ev.iloc[:0]
        drop = int(row.allocated_bytes) - int(after.allocated_bytes.iloc[0]) if not after.empty else 0
        size = output_bytes.get(before, 0)
        if size > 0 and drop >= size:
            fused[-1] += list(group)
            freed[-1] += size
        else:
            fused.append(list(group))
            freed.append(0)
    return tuple(tuple(g) for g in fused), tuple(freed)
