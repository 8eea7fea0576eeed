"""The profiler times each iteration's forward and backward between the root's marks (``meta.json``'s
``phase_times``), steady iterations marked so, on CUDA on the device's clock too."""

from __future__ import annotations

import pytest
import torch

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.analysis.phase_times import phase_times_from_meta
from memprof.analysis.records import Mark
from memprof.capture.phase_clock import PhaseClock, last_pass

STEPS = 14  # the detail policy's first 10 run hooked, then the hooks come off


def _run(tmp_path, device: str = "cpu", steps: int = STEPS):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=64)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(steps):
            zoo.train_step(model, optimizer, tuple(t.to(device) for t in make_batch(8)))
            profiler.record_stats()
    return load_trace(profiler.run_dir)


def test_the_last_micro_batch_is_timed_from_the_roots_marks() -> None:
    E, X, B = Mark.FWD_ENTER, Mark.FWD_EXIT, Mark.BWD_END
    ms = 1_000_000
    marks = [(0, E, 0, ()), (1, E, 1, ()), (2, X, 1, ()), (3, X, 0, ()), (4, Mark.BWD_ENTER, 0, ()), (5, B, -1, ()),
             (10 * ms, E, 0, ()), (13 * ms, X, 0, ()), (17 * ms, B, -1, ()), (20 * ms, Mark.OPT_ENTER, -1, ())]
    roots, (enter, exit_, end) = last_pass(marks)
    assert [marks[roots[k]][0] for k in (enter, exit_, end)] == [10 * ms, 13 * ms, 17 * ms]
    assert last_pass(marks[:4]) is None  # an evaluation step: no backward
    clock = PhaseClock(cuda=False)
    clock.end_iteration(7, marks, steady=True)
    (time,) = phase_times_from_meta({"phase_times": clock.finish()})[1]
    assert (time.iteration, time.steady, time.forward_ms, time.backward_ms) == (7, True, 3.0, 4.0)
    assert (time.host_forward_ms, time.host_backward_ms) == (3.0, 4.0)


def test_an_iterations_marks_are_read_at_the_next_poll_not_when_it_ends() -> None:
    E, X, B = Mark.FWD_ENTER, Mark.FWD_EXIT, Mark.BWD_END
    clock = PhaseClock(cuda=False)
    for iteration in range(3):
        clock.end_iteration(iteration, [(0, E, 0, ()), (2_000_000, X, 0, ()), (5_000_000, B, -1, ())], steady=False)
    assert clock.resolved == 0  # record_stats() only hands the marks over
    clock.poll()
    assert clock.resolved == 3
    assert [t.iteration for t in phase_times_from_meta({"phase_times": clock.to_meta()})[1]] == [0, 1, 2]


def test_every_iteration_is_timed_and_steady_ones_say_so(tmp_path) -> None:
    trace = _run(tmp_path)
    clock, times = phase_times_from_meta(trace.meta)
    assert clock == "host"
    assert [t.iteration for t in times] == list(range(STEPS))
    steady = dict(zip(trace.iterations.iteration, trace.iterations.template_iteration >= 0))
    assert any(steady.values())  # the run went steady: the basis the planner scales the layer times by
    assert all(t.steady == steady[t.iteration] for t in times)
    # on a CPU the device's clock is the host's, and a detailed iteration's times are its root marks' events
    events = trace.events
    for t in times:
        assert (t.forward_ms, t.backward_ms) == (t.host_forward_ms, t.host_backward_ms)
        rows = events[(events.iteration == t.iteration) & (events.module == "")]
        if rows.empty:
            continue
        enter = int(rows[(rows.phase == "forward") & (rows.event == "enter")].time_ns.iloc[-1])
        exit_ = int(rows[(rows.phase == "forward") & (rows.event == "exit")].time_ns.iloc[-1])
        assert t.host_forward_ms == pytest.approx((exit_ - enter) / 1e6, abs=1e-4)


@pytest.mark.gpu
def test_on_cuda_the_phases_are_timed_on_the_devices_clock(tmp_path) -> None:
    trace = _run(tmp_path, device="cuda")
    clock, times = phase_times_from_meta(trace.meta)
    assert clock == "cuda"
    assert [t.iteration for t in times] == list(range(STEPS))  # close() waited for the last events
    assert any(t.steady for t in times)
    assert all(t.forward_ms > 0 and t.backward_ms > 0 for t in times)
