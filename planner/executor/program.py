"""A schedule's operations as the executor runs them: each stage's forward operation, the transfers after
it, and the operations autograd's backward of each stage runs.

Part of the pure-torch runtime (imports only the standard library and its sibling ``selective``; ``planner.export.files`` embeds it in the files
it writes).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.executor.selective import split_option

F_ALL, F_CK, F_NONE, B = "F_all", "F_ck", "F_none", "B"
OFFLOAD, PREFETCH = "OFFLOAD", "PREFETCH"
FORWARD_KINDS = (F_ALL, F_CK, F_NONE)
TRANSFER_KINDS = (OFFLOAD, PREFETCH)


class Program:
    """A schedule's operations split into the forward operation of each stage and the backward segments.

    Args:
        ops: ``(kind, stage)`` pairs, stages 1..L+1, stage L+1 being the loss.
        length: L, the number of stages without the loss.

    Raises:
        ValueError: the loss is not run exactly as F_all(L+1) ... B(L+1); the forward part does not run
            stages 1..L once each in order (the model's ``forward`` calls them so); a transfer comes before
            any forward or between F_all(L+1) and B(L+1) (the executor does not run the loss); or a backward
            segment runs a stage above the one whose B ends it.
    """

    def __init__(self, ops: Sequence[tuple[str, int]], length: int) -> None:
        # A forward may carry a recomputation option ("F_all[2]", see selective.py): checked by its base kind,
        # kept whole for the runtime.
        ops = [(str(kind), int(stage)) for kind, stage in ops]
        top = length + 1
        loss_ops = [(i, kind) for i, (kind, stage) in enumerate(ops) if stage == top]
        if [kind for _, kind in loss_ops] != [F_ALL, B]:
            raise ValueError(
                f"the loss (stage {top}) must appear as F_all({top}) then B({top}), found "
                f"{[f'{kind}({top})' for _, kind in loss_ops]}"
            )
        start, end = loss_ops[0][0], loss_ops[1][0]
        forward = [(k, s) for k, s in ops[:start] if k not in TRANSFER_KINDS]
        if [stage for _, stage in forward] != list(range(1, top)) or any(_base(k) not in FORWARD_KINDS for k, _ in forward):
            raise ValueError(
                f"before the loss, the schedule must run stages 1..{length} once each, in order, as the model's "
                f"forward calls them; found {[f'{k}({s})' for k, s in forward]}"
            )
        self.after_forward = _after_forward(ops[:start])
        middle = ops[start + 1 : end]
        if any(kind == B for kind, _ in middle):
            raise ValueError(f"no B operation can run between F_all({top}) and B({top})")
        if any(kind in TRANSFER_KINDS for kind, _ in middle):
            raise ValueError(f"no transfer can run between F_all({top}) and B({top}): the executor does not run the "
                             f"loss; issue it after B({top})")
        # F operations between the loss's forward and backward commute with B(L+1): run them after it.
        self.length = length
        self.forward_kinds = tuple(kind for kind, _ in forward)
        self.segments = _segments(middle + ops[end + 1 :], length)
        counts: dict[int, int] = {}
        for kind, stage in ops:
            if _base(kind) in FORWARD_KINDS:
                counts[stage] = counts.get(stage, 0) + 1
        self.replayed = frozenset(stage for stage, count in counts.items() if count > 1)
        self.offloaded = frozenset(stage for kind, stage in ops if kind == OFFLOAD)
        # the stage of each computation the executor runs, in order (weight streaming follows it)
        self.computations = tuple(range(1, top)) + tuple(
            stage for done in range(length, 0, -1) for kind, stage in self.segments[done] if kind not in TRANSFER_KINDS)


def _base(kind: str) -> str:
    return split_option(kind)[0]


def _after_forward(forward: list[tuple[str, int]]) -> dict[int, tuple[tuple[str, int], ...]]:
    """The transfers that follow the forward of each stage, before the next one (run as its wrapper returns)."""
    out: dict[int, list[tuple[str, int]]] = {}
    current = 0
    for kind, stage in forward:
        if kind in TRANSFER_KINDS:
            if current == 0:
                raise ValueError(f"{kind}({stage}) comes before any forward; a transfer follows F_all of its stage")
            out.setdefault(current, []).append((kind, stage))
        else:
            current = stage
    return {stage: tuple(items) for stage, items in out.items()}


def _segments(backward: list[tuple[str, int]], length: int) -> dict[int, tuple[tuple[str, int], ...]]:
    """The operations after B(l+1) up to B(l), for each stage l (run when autograd brings delta^l)."""
    segments: dict[int, tuple[tuple[str, int], ...]] = {}
    current: list[tuple[str, int]] = []
    expected = length
    for kind, stage in backward:
        current.append((kind, stage))
        if kind != B:
            continue
        if stage != expected:
            raise ValueError(f"the backward operations must be B({length}) .. B(1) in turn; found B({stage}) "
                             f"where B({expected}) was due")
        above = [s for k, s in current if _base(k) in FORWARD_KINDS and s > stage]
        if above:
            raise ValueError(f"the schedule recomputes stage {above[0]} after B({above[0]}) was due")
        segments[stage] = tuple(current)
        current, expected = [], expected - 1
    if expected != 0 or current:
        raise ValueError(f"the schedule must end with B(1); it stops at B({expected + 1}) with {current} left")
    return segments


def plain_ends(program: Program) -> tuple[int, int]:
    """How many stages at the chain's start and at its end the schedule runs as plain autograd does.

    Such a stage runs ``F_all`` once, in the forward, and its ``B`` right after the next stage's: nothing of the
    schedule happens in it, so under ``torch.compile`` it can run inside the model's compiled graph instead of
    between graph breaks (:func:`trimmed_ops`). A store-all schedule is plain throughout: ``(L, 0)``.
    """
    def plain(stage: int) -> bool:
        return (program.forward_kinds[stage - 1] == F_ALL and program.segments[stage] == ((B, stage),)
                and stage not in program.replayed and stage not in program.offloaded
                and not program.after_forward.get(stage))

    head = 0
    while head < program.length and plain(head + 1):
        head += 1
    tail = 0
    while tail < program.length - head and plain(program.length - tail):
        tail += 1
    return head, tail


def trimmed_ops(ops: Sequence[tuple[str, int]], length: int, head: int, tail: int) -> list[tuple[str, int]]:
    """The operations of the stages between ``head`` plain stages and ``tail`` plain ones (see :func:`plain_ends`),
    numbered from 1, the plain tail folded into the loss: a program of ``length - head - tail`` stages."""
    last, top = length - tail, length - head - tail + 1
    out: list[tuple[str, int]] = []
    for kind, stage in ops:
        if stage == length + 1:
            out.append((kind, top))
        elif head < stage <= last:
            out.append((kind, stage - head))
    return out
