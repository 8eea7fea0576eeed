"""What the console report says of an iteration's peak beyond its ``iterations`` row, read back from a trace.

The training process prints two facts it knows from the iteration's sweep (:func:`memprof.analysis.timeline.
peak_notes`): whether the peak came after the model's forward returned and before its backward began (the loss),
and how many bytes of the previous step's weight gradients were alive there (Lightning's loop runs ``zero_grad``
after ``training_step``). ``memprof report`` reads them back here from a detailed iteration's ``events`` and
``allocations`` rows, so the report of a finished run says what its console said.
"""

from __future__ import annotations

from memprof.analysis.console import AFTER_FORWARD_KEY, EARLIER_GRADS_KEY
from memprof.categories import Category
from memprof.phases import Phase
from memprof.schema import ALLOCATIONS, EVENTS
from memprof.trace.reader import Trace

#: The ``allocations`` rows' phase of a block alive when the iteration began.
_BEFORE = "before"
#: The root module's marks that open and close a span of the step (``""`` is the root's name).
_ROOT_MARKS = ("enter", "exit")


def peak_notes(trace: Trace, iteration: int) -> dict[str, object]:
    """The report's notes on ``iteration``'s peak (:data:`AFTER_FORWARD_KEY`, :data:`EARLIER_GRADS_KEY`), or
    ``{}`` for an iteration that kept no detail.

    The peak lies between the events row with the highest ``peak_bytes`` and the row before it: it is after the
    model's forward when the last root mark before it is the root's forward ``exit``. The earlier gradients are
    the ``weight_grads`` blocks alive when the iteration began, alive at the row before the peak and freed before
    the iteration's last row, up to the ``weight_grads`` bytes at the peak (the iterations row, exact): a block
    freed between that row and the peak is then not counted, as no new weight gradient is made outside the
    backward. A peak in the backward gets none (the console's exact count can only find them where ``zero_grad``
    runs after the forward, which frees them before the backward).
    """
    events = trace.read(EVENTS, columns=["iteration", "seq", "phase", "module", "event", "peak_bytes"],
                        iterations=[iteration])
    events = events[events["iteration"] == iteration].sort_values("seq").reset_index(drop=True)
    if events.empty:
        return {}
    at = int(events["peak_bytes"].to_numpy().argmax())  # the first highest
    before = events.iloc[:at]
    marks = before[(before["module"] == "") & before["event"].isin(_ROOT_MARKS)]
    after_forward = bool(len(marks)) and (marks["phase"].iloc[-1], marks["event"].iloc[-1]) == (Phase.FORWARD.value,
                                                                                                 "exit")
    row = trace.iterations.set_index("iteration").loc[iteration]
    in_backward = str(row["peak_phase"]) == Phase.BACKWARD.value
    earlier = 0 if in_backward else min(_earlier_grad_bytes(trace, iteration, events, at),
                                        int(row[Category.WEIGHT_GRADS.value]))
    return {AFTER_FORWARD_KEY: after_forward, EARLIER_GRADS_KEY: earlier}


def _earlier_grad_bytes(trace: Trace, iteration: int, events, at: int) -> int:  # noqa: ANN001 - a DataFrame
    blocks = trace.read(ALLOCATIONS, iterations=[iteration])
    if blocks.empty:
        return 0
    seqs = events["seq"].to_numpy()
    before, end = int(seqs[max(at - 1, 0)]), int(seqs[-1])
    held = blocks[(blocks["iteration"] == iteration) & (blocks["category"] == Category.WEIGHT_GRADS.value)
                  & (blocks["phase"] == _BEFORE) & (blocks["first_seq"] <= before) & (blocks["last_seq"] >= before)
                  & (blocks["last_seq"] < end)]
    return int(held["bytes"].sum())
