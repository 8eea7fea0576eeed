"""A schedule's prediction beside what was measured when it ran, with one definition of the error.

:func:`compare` reads a measured run (a trace) against a schedule: :func:`planner.measure.runs.measure_schedule`
calls it after running the schedule, the dashboard for every measured run on disk. Reading the trace takes
pandas (through the trace reader), not torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memprof.analysis.phase_times import phase_times_from_meta
from memprof.errors import CorruptTraceError
from memprof.phases import Phase

if TYPE_CHECKING:
    from memprof.trace import Trace
    from planner.model.schedule import Schedule
    from planner.simulation.simulator import Prediction


#: ``meta.json``'s key for the steps a measured run timed without the profiler (milliseconds of each).
TIMED_KEY = "timed_step_ms"


def relative_error(predicted: float, measured: float) -> float:
    """How far the measurement lies from the prediction, as a fraction of the prediction.

    ``(measured - predicted) / predicted``: ``+0.05`` means the run used 5% more than predicted. 0 when both
    are 0; infinite when only the prediction is 0.
    """
    if predicted == 0:
        return 0.0 if measured == 0 else math.copysign(math.inf, measured)
    return (measured - predicted) / predicted


@dataclass(frozen=True)
class Comparison:
    """A schedule's prediction beside what was measured when it ran; build it by keyword.

    The peaks compared (:attr:`predicted_peak_bytes`, :attr:`measured_peak_bytes`) are the whole training
    step's when the schedule's chain has step costs (:attr:`whole_step`), what the device has; otherwise the
    chain's activation memory (the ROTOR paper's M against allocated minus model state).

    Attributes:
        predicted_chain_peak_bytes: the simulator's peak of the chain alone (activations, gradients,
            overheads).
        predicted_makespan_ms: the simulator's makespan (sum of the operations' times).
        measured_step_ms: median measured time of the forward and the backward (the optimizer step excluded,
            like the makespan), measured as close to the step without a profiler as the run allows
            (:func:`compute_ms`; :func:`planner.measure.runs.measure_schedule` times steps without it).
        predicted_step_peak_bytes: the predicted peak of the whole training step; ``None`` for a chain
            without step costs.
        measured_step_peak_bytes: the highest allocated memory of a whole step, as the allocator saw it
            (:func:`step_peak_bytes`); ``None`` when not measured.
        measured_activation_peak_bytes: the highest activation memory measured, allocated minus model state
            (:func:`activation_peak_bytes`); ``None`` when not measured.

    Raises:
        ValueError: the measurement that the compared peaks need is missing.
    """

    predicted_chain_peak_bytes: int
    predicted_makespan_ms: float
    measured_step_ms: float
    predicted_step_peak_bytes: int | None = None
    measured_step_peak_bytes: int | None = None
    measured_activation_peak_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.whole_step and self.measured_step_peak_bytes is None:
            raise ValueError("a whole-step prediction needs measured_step_peak_bytes (the allocator's step peak)")
        if not self.whole_step and self.measured_activation_peak_bytes is None:
            raise ValueError("a chain-only prediction needs measured_activation_peak_bytes (allocated minus "
                             "model state); or give predicted_step_peak_bytes and measured_step_peak_bytes")

    @property
    def whole_step(self) -> bool:
        """Whether the peaks compared are the whole training step's."""
        return self.predicted_step_peak_bytes is not None

    @property
    def predicted_peak_bytes(self) -> int:
        """The predicted peak compared: the whole step's, else the chain's."""
        if self.predicted_step_peak_bytes is not None:
            return self.predicted_step_peak_bytes
        return self.predicted_chain_peak_bytes

    @property
    def measured_peak_bytes(self) -> int:
        """The measured peak of the same quantity as :attr:`predicted_peak_bytes`."""
        measured = self.measured_step_peak_bytes if self.whole_step else self.measured_activation_peak_bytes
        assert measured is not None  # __post_init__ refused the comparison otherwise
        return measured

    @property
    def peak_error(self) -> float:
        """:func:`relative_error` of the peaks compared."""
        return relative_error(self.predicted_peak_bytes, self.measured_peak_bytes)

    @property
    def time_error(self) -> float:
        """:func:`relative_error` of the measured time against the makespan."""
        return relative_error(self.predicted_makespan_ms, self.measured_step_ms)


def step_peak_bytes(trace: Trace, skip_first: bool = True) -> int:
    """Highest allocated memory of a whole training step over the recorded iterations (the first skipped)."""
    iterations = trace.iterations
    if skip_first and len(iterations) > 1:
        iterations = iterations[iterations.iteration != iterations.iteration.min()]
    return int(iterations.peak_allocated_bytes.max())


def activation_peak_bytes(trace: Trace, skip_first: bool = True) -> int:
    """Highest activation memory (allocated minus model state) over the recorded iterations."""
    events = trace.read("events", columns=["iteration", "peak_activation_bytes"])
    if skip_first and events.iteration.nunique() > 1:
        events = events[events.iteration != events.iteration.min()]
    return int(events.peak_activation_bytes.max())


def compute_ms(trace: Trace, skip_first: bool = True) -> float:
    """Median time of an iteration's forward and backward.

    From the steps timed without the profiler after a measured run (``meta.json``'s :data:`TIMED_KEY`,
    written by :func:`planner.measure.runs.measure_schedule`) when there are some; else from the run's steady
    iterations' phase times (:mod:`memprof.analysis.phase_times`: the
    submodules' hooks off, on the device's clock), else from the first forward enter to the end of backward
    of each iteration (the host's clock, hooks on). An iteration that accumulated gradients is timed from its
    last micro-batch's forward (the root's last forward enter): one micro-batch's forward and backward, what a
    schedule's makespan predicts. NaN when no iteration has both (e.g. no ``backward end`` event).
    """
    timed = timed_step_ms(trace.meta)
    if timed:
        return float(statistics.median(timed))
    first = int(trace.iterations.iteration.min()) if skip_first and len(trace.iterations) > 1 else -1
    steady = [t.forward_ms + t.backward_ms for t in phase_times_from_meta(trace.meta)[1]
              if t.steady and t.iteration != first]
    if steady:
        return float(statistics.median(steady))
    events = trace.read("events", columns=["iteration", "time_ns", "phase", "module", "event"])
    if skip_first and events.iteration.nunique() > 1:
        events = events[events.iteration != events.iteration.min()]
    enters = events[(events.phase == Phase.FORWARD) & (events.event == "enter")]
    starts = enters.groupby("iteration").time_ns.min()
    split = trace.iterations.set_index("iteration").micro_batches
    last = enters[(enters.module == "") & enters.iteration.map(split).gt(1)].groupby("iteration").time_ns.max()
    starts.update(last)
    ends = events[(events.phase == "backward") & (events.event == "end")].groupby("iteration").time_ns.max()
    return float(((ends - starts) / 1e6).median())


def timed_step_ms(meta: Mapping[str, Any]) -> list[float]:
    """The forward-and-backward milliseconds of the steps timed without the profiler after a measured run.

    Raises:
        CorruptTraceError: ``meta.json``'s :data:`TIMED_KEY` is not a list of times.
    """
    raw = meta.get(TIMED_KEY) or []
    if not isinstance(raw, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf for v in raw):
        raise CorruptTraceError(f"meta.json's {TIMED_KEY} must be a list of milliseconds >= 0, found {raw!r}; "
                                "remove the key to compare with the profiled run's own clock")
    return [float(v) for v in raw]


def compare(schedule: Schedule, trace: Trace, prediction: Prediction | None = None) -> Comparison:
    """``schedule``'s prediction against ``trace``, a run that executed it.

    The measurements are over the recorded iterations, the first one excluded when there are more (it
    includes one-off allocations and warm-up).

    Args:
        schedule: the schedule that ran.
        trace: the measured run.
        prediction: the simulator's prediction of ``schedule``; when omitted, the one the schedule carries
            (simulated here when it carries none).
    """
    if prediction is not None:
        chain_peak, makespan = int(prediction.peak_bytes), float(prediction.makespan_ms)
    elif schedule.predicted_peak_bytes is not None and schedule.predicted_makespan_ms is not None:
        chain_peak, makespan = int(schedule.predicted_peak_bytes), float(schedule.predicted_makespan_ms)
    else:
        from planner.simulation.simulator import simulate

        simulated = simulate(schedule.chain, schedule)
        chain_peak, makespan = int(simulated.peak_bytes), float(simulated.makespan_ms)
    step = schedule.step  # with streamed weights, their resident state is in host memory
    return Comparison(
        predicted_chain_peak_bytes=chain_peak,
        predicted_makespan_ms=makespan,
        measured_step_ms=compute_ms(trace),
        predicted_step_peak_bytes=step.step_peak_bytes(chain_peak) if step is not None else None,
        measured_step_peak_bytes=step_peak_bytes(trace),
        measured_activation_peak_bytes=activation_peak_bytes(trace),
    )
