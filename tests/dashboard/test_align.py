"""One clock: a compared run's events and a measured schedule's operations on the reference's time axis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard.align import align_times, op_anchors, warp


def test_warp_is_linear_between_anchors_and_at_the_mean_rate_outside():
    out = warp(np.array([-1.0, 0.0, 5.0, 10.0, 20.0, 30.0]), np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 4.0]))
    assert out.tolist() == pytest.approx([-0.2, 0.0, 0.5, 1.0, 4.0, 6.0])


def _events(times, rows):
    return pd.DataFrame({"time_ms": times, "phase": [r[0] for r in rows], "module": [r[1] for r in rows]})


ROWS = [("other", ""), ("forward", "a"), ("forward", "a"), ("forward", "b"), ("forward", "b"),
        ("backward", "b"), ("backward", "b"), ("backward", "a"), ("backward", "a"), ("optimizer", "")]


def test_an_estimate_is_moved_onto_the_measured_runs_clock():
    measured = _events(np.array([0.0, 10, 100, 110, 300, 320, 500, 510, 700, 720]), ROWS)
    estimate = _events(np.array([0.0, 1, 10, 11, 30, 32, 50, 51, 70, 72]), ROWS)  # ten times faster
    assert align_times(estimate, measured).tolist() == pytest.approx(measured["time_ms"].tolist())


def test_runs_without_shared_events_are_not_aligned():
    other = _events(np.array([0.0, 1.0]), [("forward", "x"), ("forward", "y")])
    assert align_times(other, _events(np.array([0.0, 1.0]), [("forward", "a"), ("forward", "b")])) is None


def test_each_operation_is_found_in_the_measured_events_recomputations_included():
    # chain: stage 1 = "h.0", stage 2 = "h.1", stage 3 the loss; schedule F_ck(1) F_all(2) F_all(3) B(3) B(2)
    # F_all(1) B(1): the recomputation of h.0 in the backward shows as forward events of its submodules
    rows = [("forward", "h.0"), ("forward", "h.0"), ("forward", "h.1"), ("forward", "h.1"), ("forward", "head"),
            ("backward", "h.1"), ("backward", "h.1.mlp"), ("backward", "h.0"), ("forward", "h.0.ln"),
            ("forward", "h.0.ln"), ("backward", "h.0.ln"), ("backward", "h.0")]
    events = _events(np.array([0.0, 10, 11, 30, 31, 40, 50, 60, 61, 70, 80, 100]), rows)
    prediction = pd.DataFrame({"kind": ["F_ck", "F_all", "F_all", "B", "B", "F_all", "B"],
                               "stage": [1, 2, 3, 3, 2, 1, 1], "start_ms": [0.0, 1, 2, 2.5, 3, 4, 5],
                               "end_ms": [1.0, 2, 2.5, 3, 4, 5, 6]})
    measured, predicted = op_anchors(events, prediction, [("h.0",), ("h.1",), ()])
    # F_ck(1) F_all(2) [loss skipped] B(2) F_all(1) B(1), then B(1)'s end
    assert measured.tolist() == [0.0, 11.0, 40.0, 61.0, 80.0, 100.0]
    assert predicted.tolist() == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A profiled MLP and a schedule of it that recomputes (the lowest budget), executed under the profiler."""
    import planner
    from dashboard import callbacks_planner as cp
    from dashboard.data import TraceStore
    from memprof import load_trace
    from tests.dashboard.fixtures import profile_mlp

    root = tmp_path_factory.mktemp("align") / "traces"
    make_batch, zoo = profile_mlp(root)
    front = planner.pareto_front(planner.chain_from_trace(load_trace(root / "mlp")))
    schedule = front.schedule_at(front.min_feasible_bytes)
    again, _ = zoo.mlp(blocks=3, width=64, in_features=32)
    planner.measure_schedule(again, make_batch, schedule, root, steps=3, batch_size=256, run_id="mlp-low",
                             source_run="mlp")
    return cp.compare_measured(TraceStore(root), "mlp-low"), schedule


def test_a_measured_schedule_overlays_its_prediction_operation_by_operation(measured):
    run, schedule = measured
    assert any(op.kind.value in ("F_ck", "F_none") for op in schedule.ops)  # it recomputes
    line = run.measured
    assert "measured_ms" in line.columns  # its own clock kept for the hover
    predicted_end = float(run.predicted["end_ms"].max())
    # on the prediction's clock: the forward starts near 0 and the chain's backward ends at the prediction's end
    # (the measured run itself took several times longer under the profiler)
    measured_span = float(line["measured_ms"].max() - line["measured_ms"].min())
    assert measured_span > 0
    backward_end = line["time_ms"].to_numpy()[np.searchsorted(line["time_ms"].to_numpy(), predicted_end) - 1]
    assert backward_end <= predicted_end + 1e-6
    assert float(line["time_ms"].min()) > -0.5 * predicted_end
    # the interval where the allocator peaked overlaps the operation where the prediction peaks
    i = int(np.argmax(line["peak_bytes"].to_numpy()))
    low, high = float(line["time_ms"].iloc[max(i - 1, 0)]), float(line["time_ms"].iloc[i])
    frame = run.predicted
    top = frame.iloc[int(np.argmax(frame["peak_bytes"].to_numpy()))]
    assert low <= float(top["end_ms"]) and high >= float(top["start_ms"])
    # the measured run's own clock differs (it ran under the profiler): the alignment moved it
    assert not np.allclose(line["time_ms"], line["measured_ms"] - float(line["measured_ms"].iloc[0]), atol=0.5)
