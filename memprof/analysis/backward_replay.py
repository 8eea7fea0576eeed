"""Backward marks from the native reporter's node rows, instead of a Python pre-hook per autograd node.

The Python way (:meth:`memprof.capture.hooks.HookRecorder._watch_backward`) registers a pre-hook on the node
that made each watched activation; autograd then calls back into Python for every such node, with
the GIL, a tuple of wrapped gradients and the hook's own work: on the benchmark models that was
most of the profiler's cost on the training thread. When the native reporter runs, the forward
hooks instead note *watches* ``(sequence number, mark, module, token, output_nr)`` in a list, and
the reporter records every node run in backward (its sequence number, graph task and the addresses
of the gradients it received) and the end of every graph task. Both travel raw in the iteration's
record; the analysis (:mod:`memprof.analysis.iteration`, in the background worker) calls
:func:`replay_backward`, which replays the rows in time order with exactly the rules the Python
pre-hooks follow, so both give the same marks (``tests/memprof/test_native_backward.py`` checks it
on the example models), and the training thread does none of that work:

- a module call's mark is made once, by the first of its watched tensors whose node runs;
- the mark carries the gradient the node received for that tensor's ``output_nr``;
- ``BWD_END`` is marked when the graph task that was current at the first mark after the last
  ``BWD_END`` finishes (Python's ``queue_callback`` attaches the end callback to that task).

Tensors the reporter cannot follow (leaves, which have no node, and tensor subclasses) keep a
Python hook; in native mode such a hook only records a *candidate* ``(time, kind, index, token,
storages, graph task)``, and the replay decides it in time order with the native rows.

A token is an integer naming one module call's mark (several watches share it); a backward may run
after ``record_stats()`` ended the iteration of its forward, so the watches not yet decided are
carried to the next iteration (:class:`BackwardState`). A graph task owed a ``BWD_END`` is not: a
backward that raised never ends its task, and the Python hooks forget it at ``record_stats()`` too.
Torch-free, like the rest of the analysis.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableSet, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from memprof.analysis.records import NODE_COLUMNS, Mark, Storage

__all__ = ["NODE_COLUMNS", "NODE_GRAD", "NODE_RUN", "TASK_END", "BackwardState", "merge_marks", "replay_backward",
           "resolve_backward", "resolve_backward_reference"]

#: Row kinds written by ``memprof/capture/native/reporter.cpp`` (columns: kind, then four values).
NODE_RUN, NODE_GRAD, TASK_END = 0, 1, 2

Watch = tuple[int, int, int, int, int]  # (sequence_nr, Mark, module index, the call's token, output_nr)
Pending = tuple[int, int, int, int]  # a watch without its sequence number: (Mark, index, token, output_nr)
Candidate = tuple[int, int, int, int, list[Storage], int]  # (ns, Mark, index, token, storages, graph task)
BackwardMark = tuple[int, int, int, list[Storage]]  # (time_ns, Mark, module index, storages)


@dataclass(frozen=True)
class BackwardState:
    """What one iteration's replay hands to the next.

    Attributes:
        watches: the last iteration's watches whose call has no mark yet (their nodes may still
            run, in a backward after ``record_stats()``); older ones are forgotten (a forward
            without a backward).
    """

    watches: tuple[Watch, ...] = ()


def replay_backward(node_rows: np.ndarray | Sequence[Sequence[int]], watches: Sequence[Watch],
                    candidates: Sequence[Candidate], thread_id: int,
                    state: BackwardState) -> tuple[list[BackwardMark], BackwardState]:
    """One iteration's backward marks, from its node rows, watches and candidates.

    Args:
        node_rows: the reporter's node rows recorded during the iteration.
        watches: the watches its forward hooks made.
        candidates: the marks its Python hooks offered, in time order.
        thread_id: RecordFunction's id of the training thread.
        state: what the previous iteration's replay handed on.

    Returns:
        ``(marks, state)``: the backward marks in time order, and the state for the next iteration.
    """
    if not len(node_rows) and not candidates:  # no backward ran: the older watches are forgotten
        return [], BackwardState(tuple(watches))
    watched: dict[int, list[Pending]] = {}
    for seq, kind, index, token, output_nr in chain(state.watches, watches):
        pending = watched.get(seq)
        if pending is None:
            pending = watched[seq] = []
        pending.append((kind, index, token, output_nr))
    used: set[int] = set()
    marks = resolve_backward(node_rows, watched, candidates, thread_id, used)
    return marks, BackwardState(tuple(w for w in watches if w[3] not in used))


def merge_marks(marks: list, found: list[BackwardMark]) -> list:
    """``marks`` and ``found``, each in time order, as one list in time order (a stable merge)."""
    return sorted(marks + found, key=itemgetter(0)) if found else marks


def _runs(rows: Sequence[Sequence[int]], watched: Mapping[int, Any],
          thread_id: int) -> Iterator[tuple[int, int, int, int, dict[int, Storage]]]:
    """``(time_ns, kind, sequence_nr, graph_task, grads by input index)`` per watched run or task end.

    Backward runs many more nodes than are watched (about six per module on the benchmark
    transformer), and runs of nodes made on other threads than ``thread_id`` (the one whose
    forward hooks watch) do not count, as sequence numbers are only unique within one thread:
    both are skipped here, before any tuple is made for them.
    """
    current: list[Any] | None = None
    for kind, a, b, c, d in rows:
        if kind == NODE_GRAD:
            if current is not None:
                current[4][a] = (b, c)
            continue
        if current is not None:
            yield tuple(current)  # type: ignore[misc]
            current = None
        if kind == NODE_RUN:
            if d == thread_id and b in watched:
                current = [a, NODE_RUN, b, c, {}]
        elif kind == TASK_END:
            yield a, TASK_END, -1, b, {}
    if current is not None:
        yield tuple(current)  # type: ignore[misc]


def resolve_backward(rows: np.ndarray | Sequence[Sequence[int]], watched: Mapping[int, list[Pending]],
                     candidates: Sequence[Candidate], thread_id: int,
                     used: MutableSet[int] | None = None) -> list[BackwardMark]:
    """Turns the reporter's node rows and the Python candidates into backward marks, in time order.

    Args:
        rows: the reporter's node rows (``NODE_COLUMNS`` columns), in the order it recorded them.
        watched: sequence number -> the marks waiting for that node.
        candidates: marks offered by Python hooks (leaves, tensor subclasses), in time order.
        thread_id: RecordFunction's id of the thread whose forward made the watched nodes.
        used: tokens whose call already has its mark; the tokens marked here are added to it.

    Returns:
        ``(time_ns, Mark, module index, storages)`` tuples.
    """
    marks: list[BackwardMark] = []
    used = set() if used is None else used
    active_task: int | None = None  # the graph task the next BWD_END waits for
    rows = rows.tolist() if isinstance(rows, np.ndarray) else rows
    queue = list(candidates)
    at = 0

    def take(time_ns: int, kind: int, index: int, token: int, found: list[Storage], task: int) -> None:
        nonlocal active_task
        if token in used:
            return
        used.add(token)
        marks.append((time_ns, kind, index, found))
        if active_task is None:
            active_task = task

    for time_ns, kind, seq, task, grads in _runs(rows, watched, thread_id):
        while at < len(queue) and queue[at][0] < time_ns:  # a Python hook ran before this row
            take(*queue[at])
            at += 1
        if kind == TASK_END:
            if active_task == task:
                marks.append((time_ns, Mark.BWD_END, -1, []))
                active_task = None
            continue
        for mark, index, token, output_nr in watched.get(seq, ()):
            grad = grads.get(output_nr)
            take(time_ns, mark, index, token, [grad] if grad is not None else [], task)
    for candidate in queue[at:]:
        take(*candidate)
    return marks


def resolve_backward_reference(rows: Sequence[Sequence[int]], watched: Mapping[int, list[Pending]],
                               candidates: Sequence[Candidate], thread_id: int) -> list[tuple[int, int, int, list]]:
    """The same replay written as a simulation of the Python hooks, event by event (for tests).

    Every node run and candidate becomes one "hook call" at its time; calls are made in time order
    (rows before candidates at equal times), each doing what ``_node_ready``/``_leaf_ready`` and
    ``_backward_mark`` do, with the end callback modelled as a per-task flag.
    """
    events: list[tuple[int, int, int, Any]] = []
    current: list[Any] | None = None
    for order, (kind, a, b, c, d) in enumerate(rows):
        if kind == NODE_GRAD and current is not None:
            current[3][1][a] = (b, c)
        elif kind == NODE_RUN:
            current = [a, 0, order, ("run", {}, b, c, d)]
            events.append(current)  # type: ignore[arg-type]
        elif kind == TASK_END:
            current = None
            events.append((a, 0, order, ("end", b)))
    for order, candidate in enumerate(candidates):
        events.append((candidate[0], 1, order, ("candidate", candidate)))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    marks: list[tuple[int, int, int, list]] = []
    used: set[int] = set()
    queued_in: int | None = None  # the task holding the end callback (Python's _backward_active)
    for time_ns, _, _, payload in events:
        offers: list[tuple[int, int, int, list, int]] = []
        if payload[0] == "end":
            if queued_in == payload[1]:
                marks.append((time_ns, Mark.BWD_END, -1, []))
                queued_in = None
            continue
        if payload[0] == "run":
            _, grads, seq, task, thread = payload
            if thread != thread_id:
                continue
            for mark, index, token, output_nr in watched.get(seq, ()):
                offers.append((mark, index, token, [grads[output_nr]] if output_nr in grads else [], task))
        else:
            _, mark, index, token, found, task = payload[1]
            offers.append((mark, index, token, found, task))
        for mark, index, token, found, task in offers:
            if token not in used:
                used.add(token)
                marks.append((time_ns, mark, index, found))
                if queued_in is None:
                    queued_in = task
    return marks
