"""The allocations and stacks tables: the tensors alive at every moment add up to the timeline, with their ops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.trace.drilldown import LIVE_COLUMNS, allocations_with_ops, live_allocations

IN, HIDDEN, OUT, BATCH = 64, 256, 4, 32


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("traces"), print_period=0,
                        detail_first=2, detail_every=4, stack_min_bytes=BATCH * HIDDEN * 4) as profiler:
        for _ in range(6):
            zoo.train_step(model, optimizer, (torch.randn(BATCH, IN), torch.randint(0, OUT, (BATCH,))))
            profiler.record_stats()
    return profiler.run_dir


def test_the_tensors_alive_at_every_event_add_up_to_the_allocated_bytes(run):
    trace = load_trace(run)
    assert trace.detail_iterations == [0, 1, 4]
    for iteration in trace.detail_iterations:
        events = trace.read("events", iterations=[iteration]).sort_values("seq")
        for seq, allocated in zip(events.seq.tolist(), events.allocated_bytes.tolist()):
            live = live_allocations(trace, iteration, seq)
            assert int(live["bytes"].sum()) == allocated, (iteration, seq)
        assert list(live.columns) == list(LIVE_COLUMNS)


def test_a_weight_and_an_activation_are_named_with_their_call_and_stack(run):
    trace = load_trace(run)
    events = trace.read("events", iterations=[4])
    forward_done = int(events[(events.phase == "forward") & (events.module == "") & (events.event == "exit")].seq.iloc[0])
    live = live_allocations(trace, 4, forward_done)
    weight = IN * HIDDEN * 4  # by hand: the first Linear's weight, float32
    assert ((live["bytes"] == weight) & (live["category"] == "weights") & (live["phase"] == "before")).sum() == 1
    # the ReLU's output (batch x hidden, kept for the second Linear's backward); the first Linear's is freed by now
    output = live[(live["bytes"] == BATCH * HIDDEN * 4) & (live["module"] == "1")]
    assert output["op"].tolist() == ["torch.nn.functional.relu"] and output["phase"].tolist() == ["forward"]
    assert output["category"].tolist() == ["feature_maps"]
    assert output["stack"].iloc[0].splitlines()[-1].endswith("in train_step")  # the user's frame, not torch's
    assert live["bytes"].is_monotonic_decreasing  # the largest first


def test_the_capture_changes_no_measured_byte(run):
    """A dispatch mode wrapped scalars into 8-byte tensors; the function mode used instead allocates nothing."""
    peaks = load_trace(run).iterations
    assert peaks.loc[peaks.iteration > 0, "peak_allocated_bytes"].nunique() == 1  # detailed or not, one peak


def test_stacks_only_above_the_threshold_and_only_in_scheduled_iterations(run):
    trace = load_trace(run)
    stacks = trace.read("stacks")
    assert sorted(set(stacks["iteration"])) == [0, 1, 4]  # 2, 3, 5 have no detail: nothing captured
    big = stacks["bytes"] >= BATCH * HIDDEN * 4
    assert big.any() and (stacks.loc[big, "stack"] != "").all() and (stacks.loc[~big, "stack"] == "").all()
    joined = allocations_with_ops(trace, 1)
    # every allocation the model's forward made has the call that made it (after the forward returned, the loss's
    # own backward, run by autograd's engine before the model's output has its gradient, makes some without one)
    forward = joined[(joined["phase"] == "forward") & (joined["module"] != "")]
    assert len(forward) and (forward["op"] != "").all()


def test_a_trace_without_the_tables_lists_nothing(run, tmp_path):
    import shutil

    copy = Path(shutil.copytree(run, tmp_path / "old"))
    shutil.rmtree(copy / "allocations.parquet")
    shutil.rmtree(copy / "stacks.parquet")
    trace = load_trace(copy)
    assert live_allocations(trace, 1, 3).empty
    assert len(trace.events)  # the rest reads as before
