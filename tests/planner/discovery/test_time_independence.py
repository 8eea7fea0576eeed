"""Plans whatever the machine's load: the same trace timed anew plans the same chain, bytes and minimum budgets.

A busy machine times every layer and op of a profiled step several times slower or faster than a quiet one, and
unevenly. Only the schedules' times may follow (the DP picks the fastest of the schedules that fit a budget):
which chain, which stages, their bytes, their recomputation options, the step around the chain and every
minimum feasible budget are memory facts. Each model is profiled once, with a planning pass (so its stages get
options), and planned again from the same trace with every recorded time scaled by its own random factor in
[0.3, 3] (:mod:`tests.planner.discovery.retimed_trace`), four draws.

The models: the ResNet of ``test_real_models.py`` (torchvision's layout), a transformers GPT-2 (its loss stage
has chunked options), and the U-Net of ``test_graphs.py``, whose skips are carried across stages (before, its
minimum moved by 1.4% between two timings: the fastest schedule at the solver's minimum decided it,
:mod:`planner.solvers.carried_fit`).
"""

from __future__ import annotations

import pytest
import torch

from memprof import load_trace
from planner import chain_from_trace, min_feasible_budget, store_all_budget
from planner.model.chain import Chain
from tests.planner.discovery.retimed_trace import retimed
from tests.planner.discovery.test_real_models import _profile
from tests.planner.graph_models import GRAPH_BUILDERS
from tests.planner.real_models import ALL_BUILDERS

pytestmark = pytest.mark.slow

BUILDERS = {"resnet": ALL_BUILDERS["resnet"], "gpt2": ALL_BUILDERS["gpt2"], "unet": GRAPH_BUILDERS["unet"]}
DRAWS = range(4)
ALGORITHMS = ("rotor", "selective")


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def trace(request, tmp_path_factory):
    torch.manual_seed(0)
    _, extra = _profile(BUILDERS[request.param](), tmp_path_factory.mktemp(request.param), ops=True)
    return load_trace(extra["run_dir"])


def _memory(chain: Chain) -> dict:
    """Everything about ``chain`` that must not depend on the measured times."""
    return {
        "stages": [list(group) for group in chain.source["modules"]],
        "bytes": [(s.output_bytes, s.saved_bytes, s.grad_bytes, s.forward_overhead_bytes, s.backward_overhead_bytes,
                   s.weight_grad_bytes) for s in chain.stages],
        "options": [[(o.name, o.saved_bytes, o.saves, o.recompute_flops, o.chunks, o.eager) for o in s.options]
                    for s in chain.stages],
        "carried": chain.carried,
        "step": chain.step,
        "store_all": store_all_budget(chain),
        **{f"minimum {a}": min_feasible_budget(chain, a) for a in ALGORITHMS},
    }


def test_the_same_trace_timed_anew_plans_the_same_memory(trace) -> None:
    chain = chain_from_trace(trace)
    expected = _memory(chain)
    assert any(stage.options for stage in chain.stages[:-1])  # the planning pass gave the stages options
    if trace.meta["model"] == "UNet":
        assert chain.carried  # the skips
    for seed in DRAWS:
        again = chain_from_trace(retimed(trace, seed))
        # the draw changed the times (else this test would prove nothing)
        assert [s.forward_ms for s in again.stages] != pytest.approx([s.forward_ms for s in chain.stages], rel=0.05)
        found = _memory(again)
        assert found == expected, {key: (found[key], expected[key]) for key in expected if found[key] != expected[key]}


def test_the_minimum_is_solved_at_every_timing(trace) -> None:
    """The minimum is the same for every draw, and each draw's own times solve it (the DP's fastest schedule or,
    for the U-Net's skips, one of the fixed-timing schedules the minimum was measured on)."""
    from planner import solve

    minimum = min_feasible_budget(chain_from_trace(trace))
    for seed in DRAWS:
        schedule = solve(chain_from_trace(retimed(trace, seed)), minimum, "rotor")
        assert schedule.predicted_step_peak_bytes is not None and schedule.predicted_step_peak_bytes <= minimum
