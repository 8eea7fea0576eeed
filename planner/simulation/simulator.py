"""Replays a schedule on a chain and predicts its peak, makespan and timeline.

The memory rules are the ROTOR paper's (Beaumont et al., ACM TOMS 2024), with tensor streaming, recomputation
options and streamed weights, in :mod:`planner.simulation.memory_rules` (the one copy); carried tensors' in
:mod:`planner.simulation.carried_memory`. When copies run and are retired, and what the makespan is then, is
:mod:`planner.simulation.streams`: the compute stream waits for a copy only where one must be retired.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind, Schedule
from planner.simulation.carried_memory import with_carried
from planner.simulation.memory_rules import Memory
from planner.simulation.memory_state import MemoryState, StepError, names
from planner.simulation.prediction import FRAME_COLUMNS, Prediction, TimelinePoint
from planner.simulation.replay import Replay

__all__ = ["FRAME_COLUMNS", "MemoryState", "Prediction", "StepError", "TimelinePoint", "initial_state", "predict",
           "predict_with_host", "simulate", "step"]


def initial_state(chain: Chain) -> MemoryState:
    """The start state: ``a^0`` and ``delta^{L+1}`` held."""
    return Memory.start(chain).freeze()


def step(chain: Chain, state: MemoryState, op: Op) -> tuple[MemoryState, int]:
    """Applies one operation to an immutable state (the exhaustive search's move).

    Returns:
        The state after the operation and the memory in bytes during it (overhead included).

    Raises:
        StepError: the operation's inputs are not in memory (the message says which).
    """
    memory = Memory(chain, set(state.plain), set(state.saved), state.delta, state.live_bytes,
                     options=dict(state.options))
    during, _, _ = memory.apply(op)
    return memory.freeze(), during


_STREAM = {OpKind.OFFLOAD: "d2h", OpKind.PREFETCH: "h2d"}


def simulate(chain: Chain, schedule: Schedule | Iterable[Op], streamed: Iterable[int] | None = None) -> Prediction:
    """Replays ``schedule`` (a :class:`Schedule` or a sequence of :class:`Op`) on ``chain``.

    ``streamed``: the stages whose weights are streamed from host memory (:mod:`planner.simulation.weight_streams`);
    ``None`` takes a :class:`Schedule`'s own (``params.streamed_weights``), none for a bare sequence.

    The memory counts the chain's carried tensors (:mod:`planner.simulation.carried_memory`).

    Raises:
        InvalidScheduleError: at the first operation whose inputs are missing (naming its position, the
            operation and what was missing), or when the sequence ends without computing ``delta^0``.
        ScheduleMismatchError: a :class:`Schedule` made for another chain.
    """
    memory = Memory.start(chain)
    start_live = names(memory.plain, memory.saved, memory.delta)
    points = []
    peak = memory.live
    host_peak = 0
    replay = Replay(chain, schedule, memory, streamed)
    for index, op, during, start, end, added, freed in replay:
        host = memory.host + replay.host_weights
        points.append(TimelinePoint(index, op, start, end, memory.live + replay.held, during, added, freed,
                                    _STREAM.get(op.kind, "compute"), host))
        peak = max(peak, during)
        host_peak = max(host_peak, host)
    makespan = max([p.end_ms for p in points] + [replay.copies_end_ms])
    return with_carried(chain, Prediction(peak, makespan, tuple(points), start_live, host_peak))


def predict(chain: Chain, schedule: Schedule | Iterable[Op], streamed: Iterable[int] | None = None) -> tuple[int, float]:
    """``(peak_bytes, makespan_ms)`` of ``schedule`` -- :func:`simulate` without the timeline, faster.

    Raises:
        InvalidScheduleError, ScheduleMismatchError: as :func:`simulate`.
    """
    peak, makespan, _ = predict_with_host(chain, schedule, streamed)
    return peak, makespan


def predict_with_host(chain: Chain, schedule: Schedule | Iterable[Op],
                      streamed: Iterable[int] | None = None) -> tuple[int, float, int]:
    """``(peak_bytes, makespan_ms, host_peak_bytes)`` of ``schedule``, without the timeline.

    Raises:
        InvalidScheduleError, ScheduleMismatchError: as :func:`simulate`.
    """
    if chain.carried:  # their rule reads the timeline
        prediction = simulate(chain, schedule, streamed)
        return prediction.peak_bytes, prediction.makespan_ms, prediction.host_peak_bytes
    memory = Memory.start(chain, named=False)
    peak = memory.live
    host_peak = 0
    end_ms = 0.0
    replay = Replay(chain, schedule, memory, streamed)
    for _, _, during, _, end, _, _ in replay:
        peak = max(peak, during)
        host_peak = max(host_peak, memory.host)
        end_ms = max(end_ms, end)
    return peak, max(end_ms, replay.copies_end_ms), host_peak + replay.host_weights
