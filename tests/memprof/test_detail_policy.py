"""Long runs keep every iteration's summary and the detail of the iterations the policy names."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.schema import ITERATIONS_SCHEMA

#: Summary columns that must not depend on whether an iteration kept its detail.
SUMMARY = ["iteration", "epoch", "peak_allocated_bytes", "allocated_bytes", "peak_phase", "peak_module",
           "num_events", "num_allocations", "weights", "buffers", "weight_grads", "feature_maps", "weight_copies",
           "grads", "optimizer_state", "comm_buffers", "inputs", "other"]


def _run(tmp_path, name, steps, background=True, fail_at=None, request=(), big=(), **policy):
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    profiler = MemoryProfiler(model, optimizer, out_dir=tmp_path, run_id=name, print_period=0,
                              background=background, **policy)
    with pytest.raises(MemoryError) if fail_at is not None else _nothing(), profiler:
        for step in range(steps):
            if step == fail_at:
                model(make_batch(8)[0])
                raise MemoryError("simulated out of memory")
            zoo.train_step(model, optimizer, make_batch(32 if step in big else 8))
            profiler.record_stats(detail=step in request)
    return load_trace(profiler.run_dir)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _detail_sets(trace):
    return (trace.detail_iterations, sorted(set(trace.layers.iteration)), sorted(set(trace.events.iteration)))


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_first_every_and_requested_iterations_keep_their_detail(tmp_path, background):
    trace = _run(tmp_path, "run", 25, background=background, request=(13,), detail_first=3, detail_every=10,
                 detail_peak_rise=100.0)
    expected = [0, 1, 2, 10, 13, 20]
    assert _detail_sets(trace) == (expected, expected, expected)
    assert len(trace.iterations) == 25 and trace.iterations.iteration.tolist() == list(range(25))
    assert trace.meta["detail"] == {"first": 3, "every": 10, "peak_rise": 100.0, "iterations": expected}
    assert trace.read("events", iterations=[13]).iteration.unique().tolist() == [13]
    assert trace.read("layers", iterations=[14]).empty  # a detail-free iteration has no rows to read


def test_summary_rows_do_not_depend_on_the_detail(tmp_path):
    sparse = _run(tmp_path, "sparse", 12, detail_first=1, detail_every=5, detail_peak_rise=100.0).iterations
    full = _run(tmp_path, "full", 12, detail_first=0, detail_every=1).iterations
    assert sparse.detail.tolist() == [i in (0, 5, 10) for i in range(12)] and full.detail.all()
    pd.testing.assert_frame_equal(sparse[SUMMARY], full[SUMMARY])


def test_a_new_peak_keeps_its_detail(tmp_path):
    trace = _run(tmp_path, "run", 12, big=(7,), detail_first=3, detail_every=0, detail_peak_rise=0.01)
    peaks = trace.iterations.set_index("iteration").peak_allocated_bytes
    assert 7 in trace.detail_iterations and peaks[7] == peaks.max()
    later = [i for i in trace.detail_iterations if i > 7]
    assert later == []  # nothing after it rose above it


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_the_failed_iteration_and_the_one_before_keep_their_detail(tmp_path, background):
    trace = _run(tmp_path, "run", 20, background=background, fail_at=12, detail_first=2, detail_every=100,
                 detail_peak_rise=100.0)
    assert trace.meta["status"] == "failed"
    expected = [0, 1, 11, 12]
    assert _detail_sets(trace) == (expected, expected, expected)
    assert trace.iterations.iteration.tolist() == list(range(13))  # 11 written again, read once
    assert trace.meta["detail"]["iterations"] == expected


def test_a_version_1_trace_has_detail_for_every_iteration(tmp_path):
    trace = _run(tmp_path, "run", 3, detail_first=0, detail_every=2, detail_peak_rise=100.0)
    run = trace.path
    meta = json.loads((run / "meta.json").read_text())
    meta["schema_version"] = 1
    (run / "meta.json").write_text(json.dumps(meta))
    import pyarrow.parquet as pq

    for part in (run / "iterations.parquet").glob("part-*.parquet"):  # as version 1 wrote them
        pq.write_table(pq.read_table(part).drop_columns(["detail"]), part)
    old = load_trace(run)
    assert old.iterations.detail.tolist() == [True, True, True]
    assert old.iterations.dtypes["detail"] == ITERATIONS_SCHEMA.field("detail").type.to_pandas_dtype()
    assert old.read("iterations", columns=["detail"]).detail.all()
    assert old.detail_iterations == [0, 1, 2]


def test_bad_policy_arguments_are_refused(tmp_path):
    from memprof.errors import ProfilerError

    with pytest.raises(ProfilerError, match="detail_every"):
        MemoryProfiler(torch.nn.Linear(2, 2), out_dir=tmp_path, detail_every=-1)
