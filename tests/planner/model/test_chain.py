"""Loading chains: a-bar measured slightly below a is raised to a with a warning; more below is refused."""

from __future__ import annotations

import warnings

import pytest

from planner.errors import ChainError, ChainWarning
from planner.model.chain import Chain, Stage
from tests.planner.chain_strategies import toy_chain

# The ROTOR paper's Table 2 as printed (MB read as MiB): index, a, a-bar, o_f, o_b, u_f, u_b. Stage 4's
# a-bar (10.66) is below its a (10.68): measurement noise.
TABLE_2 = [
    (1, 9.54, 9.54, 0.00, 20.01, 1.60, 3.05),
    (2, 10.68, 10.68, 0.00, 27.64, 2.20, 4.48),
    (3, 11.06, 11.08, 0.00, 30.99, 2.44, 5.09),
    (4, 10.68, 10.66, 0.00, 30.99, 2.51, 4.93),
    (5, 9.54, 9.54, 0.00, 27.64, 2.10, 4.21),
    (6, 7.63, 7.63, 0.00, 19.08, 1.43, 3.34),
]
INPUT_MB = 7.63


def mib(value: float) -> int:
    return round(value * 2**20)


def table_2_as_printed() -> dict:
    stages = [
        {"name": f"linear{index}", "forward_ms": u_f, "backward_ms": u_b, "output_bytes": mib(a),
         "saved_bytes": mib(abar), "forward_overhead_bytes": mib(o_f), "backward_overhead_bytes": mib(o_b)}
        for index, a, abar, o_f, o_b, u_f, u_b in TABLE_2
    ]
    loss = {"name": "loss", "forward_ms": 0.0, "backward_ms": 0.0, "output_bytes": 0, "saved_bytes": 0}
    return {"name": "rotor-toy", "input_bytes": mib(INPUT_MB), "stages": [*stages, loss]}


def test_table_2_loads_as_printed_with_a_warning() -> None:
    with pytest.warns(ChainWarning) as record:
        chain = Chain.from_json(table_2_as_printed())
    assert len(record) == 1
    message = str(record[0].message)
    assert "stage 4 (linear4)" in message and str(mib(10.66)) in message and str(mib(10.68)) in message
    assert record[0].filename == __file__  # the warning points at the caller of from_json
    assert chain.stage(4).saved_bytes == chain.stage(4).output_bytes == mib(10.68)
    assert chain.stages == toy_chain().stages  # the toy JSON is the table with that correction


def test_no_warning_when_a_bar_contains_a() -> None:
    data = table_2_as_printed()
    data["stages"][3]["saved_bytes"] = data["stages"][3]["output_bytes"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Chain.from_json(data)


def test_a_bar_far_below_a_is_refused() -> None:
    data = table_2_as_printed()
    data["stages"][3]["saved_bytes"] = mib(10.68) // 2
    with pytest.raises(ChainError, match=r"stage 4 \(linear4\): saved_bytes \(a-bar, 5599396\) must include "
                                         r"output_bytes \(a, 11198792\); expected saved_bytes >= output_bytes, "
                                         r"or at most 5% below it"):
        Chain.from_json(data)


def test_stage_built_directly_still_refuses_a_bar_below_a() -> None:
    with pytest.raises(ChainError, match=r"saved_bytes \(a-bar, 9\) must include output_bytes \(a, 10\)"):
        Stage(1.0, 1.0, output_bytes=10, saved_bytes=9, grad_bytes=10)
