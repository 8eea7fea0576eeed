"""The replay of a schedule on the clocks of the compute stream and the copy streams.

:class:`Replay` walks a schedule's operations, applies each to the simulator's memory (the one copy of the
operations' memory rules, :mod:`planner.simulation.memory_rules`), and times it with :mod:`planner.simulation.streams` (activation
copies) and :mod:`planner.simulation.weight_streams` (streamed weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from planner.errors import ChainError, InvalidScheduleError, ScheduleMismatchError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind, Schedule
from planner.model.weights import check_streamed
from planner.simulation.memory_state import StepError
from planner.simulation.streams import CopyStreams
from planner.simulation.weight_streams import WeightStreams

if TYPE_CHECKING:
    from planner.simulation.memory_rules import Memory

__all__ = ["Replay", "as_op"]


class Replay:
    """Applies each operation to ``memory`` on the clock of :mod:`planner.simulation.streams` (an iterator).

    Yields its index, the op, the device memory during it, its start and end, and what it (and the copies
    retired before it) added and freed. ``held`` is what streamed weights hold on the device after the op
    yielded last, ``host_weights`` the host memory they hold, ``copies_end_ms`` when their last copy ends.
    """

    def __init__(self, chain: Chain, schedule: Schedule | Iterable[Op], memory: Memory,
                 streamed: Iterable[int] | None) -> None:
        self.chain, self.memory = chain, memory
        if isinstance(schedule, Schedule):
            if schedule.chain.fingerprint() != chain.fingerprint():
                raise ScheduleMismatchError(
                    f"the schedule was made for chain {schedule.chain.name!r} ({schedule.chain.length} stages, "
                    f"fingerprint {schedule.chain.fingerprint()}), not for {chain.name!r} ({chain.length} stages, "
                    f"fingerprint {chain.fingerprint()})"
                )
            if streamed is None:
                streamed = schedule.streamed_weights
            self.ops: Iterable[Any] = schedule.ops
        else:
            self.ops = schedule
        try:
            chosen = check_streamed(chain.weights, streamed or (), chain.length)
        except ChainError as exc:
            raise InvalidScheduleError(str(exc)) from None
        self.streams = CopyStreams(chain, memory)
        self.weights: WeightStreams | None = None
        if chosen:
            self.ops = [as_op(raw, index) for index, raw in enumerate(self.ops)]
            stages = [op.stage for op in self.ops if not op.kind.is_transfer and op.stage <= chain.length]
            self.weights = WeightStreams(chain, self.streams, chosen, stages)
            memory.reserved = self.weights.host_bytes
            cap = chain.transfer_costs.host_cap_bytes
            if cap is not None and memory.reserved > cap:
                raise InvalidScheduleError(f"the streamed weights need {memory.reserved} bytes of host memory, above "
                                           f"the chain's host cap of {cap} bytes")

    @property
    def held(self) -> int:
        return self.weights.held_bytes if self.weights is not None else 0

    @property
    def host_weights(self) -> int:
        return self.weights.host_bytes if self.weights is not None else 0

    @property
    def copies_end_ms(self) -> float:
        return self.weights.end_ms if self.weights is not None else 0.0

    def __iter__(self) -> Iterator[tuple[int, Op, int, float, float, tuple[str, ...], tuple[str, ...]]]:
        chain, memory, streams, weights = self.chain, self.memory, self.streams, self.weights
        stages = chain.stages
        top = chain.length + 1
        count = 0
        for index, raw in enumerate(self.ops):
            op = as_op(raw, index)
            try:
                if op.stage > top:
                    raise StepError(f"stage {op.stage} does not exist; the chain has stages 1..{top}")
                retired_added, retired_freed = streams.before(op)
                if op.kind.is_transfer:
                    if memory.delta == 0:
                        raise StepError("delta^0 is already computed; no operation may follow")
                    start, end, added, freed = streams.issue(op)
                    during = memory.live + self.held
                else:
                    spec = stages[op.stage - 1]
                    if op.kind is OpKind.B:  # after a selective recording, B recomputes first
                        duration = spec.backward_ms + spec.recompute_ms_with(memory.options.get(op.stage, 0))
                    else:
                        duration = spec.forward_ms
                    if memory.delta == 0:
                        raise StepError("delta^0 is already computed; no operation may follow")
                    extra = weights.enter(op) if weights is not None else 0
                    during, added, freed = memory.apply(op)
                    during += extra
                    start, end = streams.compute(duration)
                    if weights is not None:
                        weights.leave(op, memory)
            except StepError as exc:
                raise InvalidScheduleError(f"op {index} {op}: {exc}") from None
            count = index + 1
            if retired_added or retired_freed:  # the retirement, then the op: (S - f1 + a1) - f2 + a2
                added = tuple(n for n in retired_added if n not in freed) + added
                freed = retired_freed + freed
            yield index, op, during, start, end, added, freed
        if memory.delta != 0:
            raise InvalidScheduleError(
                f"the sequence ends after {count} operations without computing delta^0 "
                f"(the last gradient computed is delta^{memory.delta}); expected it to end with B(1)"
            )


def as_op(raw: Any, index: int) -> Op:
    """``raw`` as an :class:`Op`: itself, or a ``(kind, stage)`` pair (op ``index`` in the error).

    Raises:
        InvalidScheduleError: neither.
    """
    if isinstance(raw, Op):
        return raw
    try:
        kind, stage = raw
        return Op(OpKind(kind), int(stage))
    except (TypeError, ValueError) as exc:
        raise InvalidScheduleError(f"op {index}: expected an Op or a (kind, stage) pair, found {raw!r}") from exc
