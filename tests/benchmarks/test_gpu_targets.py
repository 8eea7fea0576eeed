"""The GPU benchmark's judgements and records (``benchmarks/gpu_targets.py``): pure, checked without a device."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.gpu_targets import (
    ERROR,
    FAIL,
    INFO,
    PASS,
    SKIPPED,
    CheckResult,
    judged,
    percent,
    read_results,
    results_table,
    tally,
    within,
)

MiB = 2**20


def test_within_is_relative_to_the_prediction_plus_the_slack_either_side() -> None:
    assert within(105.0, 100.0, rel=0.05) and within(95.0, 100.0, rel=0.05)
    assert not within(105.01, 100.0, rel=0.05) and not within(94.99, 100.0, rel=0.05)
    predicted = 400 * MiB  # a whole-step peak: 5% + 1 MiB is 21 MiB
    assert within(predicted + 21 * MiB, predicted, rel=0.05, abs_bytes=MiB)
    assert not within(predicted + 21 * MiB + 1, predicted, rel=0.05, abs_bytes=MiB)
    assert within(predicted - 21 * MiB, predicted, rel=0.05, abs_bytes=MiB)
    assert within(3, 2, rel=0, abs_bytes=1) and not within(4, 2, rel=0, abs_bytes=1)
    assert within(7, 7, rel=0) and not within(8, 7, rel=0)  # "equal": no slack at all


def test_within_refuses_what_it_cannot_judge() -> None:
    with pytest.raises(ValueError, match="rel and abs_bytes must be >= 0"):
        within(1, 1, rel=-0.1)
    with pytest.raises(ValueError, match="not finite"):
        within(math.nan, 1, rel=0.1)
    with pytest.raises(ValueError, match="not finite"):
        within(1, math.inf, rel=0.1)


def test_judgement_and_formatting() -> None:
    assert judged(True) == PASS and judged(False) == FAIL
    assert percent(0.004213) == "+0.42%" and percent(-0.05) == "-5.00%" and percent(math.inf) == "inf"


def test_a_result_is_one_json_line_and_back() -> None:
    result = CheckResult("plan.rotor.peak", "rotor", "1.0 GiB", "1.0 GiB", "+0.10%", "within 5% + 1 MiB", PASS, "n")
    line = result.to_json()
    assert "\n" not in line and CheckResult.from_dict(json.loads(line)) == result
    with pytest.raises(ValueError, match="status must be one of pass, fail, info, error, skipped"):
        CheckResult("x", "y", status="ok")
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\].*rerun benchmarks/bench_gpu.py"):
        CheckResult.from_dict({"check": "x", "status": PASS, "colour": "red"})
    with pytest.raises(ValueError, match="not a check result"):
        CheckResult.from_dict({"what": "no check"})
    with pytest.raises(ValueError, match="not a check result"):
        CheckResult.from_dict([1, 2])  # type: ignore[arg-type]


def test_the_results_of_a_killed_benchmark_are_read_up_to_its_torn_line() -> None:
    lines = [CheckResult("a", "first", status=PASS).to_json(), CheckResult("b", "second", status=INFO).to_json()]
    assert [r.check for r in read_results("\n".join(lines) + "\n")] == ["a", "b"]
    assert [r.check for r in read_results("\n".join(lines) + '\n{"check": "c", "sta')] == ["a", "b"]
    with pytest.raises(ValueError):
        read_results('{"check": "c", "sta\n' + lines[0])  # torn in the middle is not a kill: refused
    assert read_results("") == []


def test_the_table_and_the_tally() -> None:
    results = [CheckResult("a", "w", "1", "2", "+1%", "within 1%", PASS),
               CheckResult("b", "w", status=ERROR, note="RuntimeError: x | y\nz"),
               CheckResult("c", "w", status=SKIPPED, note="needs CUDA")]
    table = results_table(results).splitlines()
    assert table[0] == "| check | what | measured | against | error | target | result | note |"
    assert table[2] == "| `a` | w | 1 | 2 | +1% | within 1% | **pass** |  |"
    assert table[3].endswith("| **error** | RuntimeError: x \\| y z |") and len(table) == 5
    assert tally(results) == "1 pass, 1 error, 1 skipped" and tally([]) == "no results"
