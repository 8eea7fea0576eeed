"""Predicted against measured on profiled zoo models: every algorithm, several budgets.

The prediction is the whole training step's peak (the chain's simulated memory on top of what the step
holds besides it), compared with the whole step's measured peak.
"""

from __future__ import annotations

import pytest
import torch

from examples import zoo
from planner import (
    ALGORITHMS,
    InfeasibleBudgetError,
    chain_from_trace,
    min_feasible_budget,
    solve,
    store_all_budget,
)
from planner.measure.runs import measure_schedule
from tests.memprof.helpers import profile_steps
from tests.planner.schedule_probe import ScheduleProbe

# Batch sizes at which the chain's activations set the step's peak, so schedules differ: at 64 the MLP's minimum
# budget was store-all's and every algorithm gave the same peak.
MODELS = {
    "mlp": (lambda: zoo.mlp(blocks=6, width=256), 512, None),
    "cnn": (lambda: zoo.cnn(channels=16, blocks=4, image=16), 8, "features"),
    "transformer": (lambda: zoo.transformer(layers=4, dim=64, seq=32), 4, "h"),
}
STEPS = 3


def prediction_band(predicted: int, largest_gradient: int) -> tuple[float, float]:
    """Where a measured step peak must lie for a prediction ``predicted`` (bytes).

    Never more than 0.1% above it: the prediction is an upper bound (measured on this machine: at most 128 B
    above, on the CNN). Below it by at most 1% plus one gradient of the chain: the executor frees delta^l as
    soon as the stage's first backward operation used it, as plain autograd does, where the simulator's rules
    hold it through B(l) (measured here: 0 to 256 B on the CNN, 35 KiB on the transformer, 257 KiB on the
    MLP at batch 512, against gradients of 128 KiB, 32 KiB and 512 KiB and steps of 1.5 to 6.2 MB). The old
    band, 5% + 1 MiB, was wider than the transformer's whole store-all activations.
    """
    return predicted - 0.01 * predicted - largest_gradient, predicted * 1.001


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_measured_peak_follows_the_prediction_for_every_algorithm(tmp_path, name):
    build, batch_size, container = MODELS[name]
    torch.manual_seed(0)
    model, make_batch = build()
    trace = profile_steps(model, make_batch, tmp_path / "profile", steps=3, batch_size=batch_size)
    chain = chain_from_trace(trace, container)
    low, high = min_feasible_budget(chain), store_all_budget(chain)
    assert low < 0.9 * high  # schedules have room to differ from store-all (0.83 on the MLP, the closest)
    largest_gradient = max(stage.grad_bytes for stage in chain.stages)

    def measured(schedule):
        torch.manual_seed(0)
        fresh, batches = build()
        probe = ScheduleProbe(fresh, schedule, container)  # the schedule ran: its recomputations, counted
        _, cmp = measure_schedule(fresh, batches, schedule, tmp_path / "runs", container=container, steps=STEPS,
                                  batch_size=batch_size, source_run=trace.run_id, timed_steps=1)
        probe.assert_ran(STEPS + 1)  # the profiled steps and the one timed without the profiler
        return cmp

    results = []
    for budget in (low, (low + high) // 2, high):
        for algorithm in ALGORITHMS:
            try:
                schedule = solve(chain, budget, algorithm)
            except InfeasibleBudgetError:
                continue
            cmp = measured(schedule)
            # Offloaded activations go to host buffers the executor keeps from step to step; on a CPU they are
            # in the allocator the profiler reads, beside the device's memory the prediction is about.
            host = schedule.predicted_host_peak_bytes or 0
            predicted = cmp.predicted_step_peak_bytes + host  # the whole step, the same quantity as measured
            lowest, highest = prediction_band(predicted, largest_gradient)
            assert lowest <= cmp.measured_step_peak_bytes <= highest, (algorithm, budget, cmp)
            assert cmp.measured_step_peak_bytes <= 1.001 * (budget + host)
            results.append((algorithm, budget, host, predicted, cmp.measured_step_peak_bytes))
    assert len(results) >= 4
    # Below store-all's peak by what was predicted: what a schedule saves is measured, not only its peak.
    store_all = next(r for r in results if r[0] == "store_all")
    for algorithm, budget, host, predicted, measured_peak in results:
        if host:
            continue  # an offload's host buffers are beside the device memory saved (see above)
        saving, predicted_saving = store_all[4] - measured_peak, store_all[3] - predicted
        assert abs(saving - predicted_saving) <= 0.01 * store_all[3] + largest_gradient, (algorithm, budget)
    assert max(store_all[4] - r[4] for r in results) >= 0.1 * store_all[4]  # measured: 18% (MLP) to 48% (CNN)
