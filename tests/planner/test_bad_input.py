"""Bad planner input: chain files, budgets and schedules, through the API and the ``memprof`` command."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprof import (
    MemprofError,
    load_trace,
    parse_bytes,
)
from memprof.units import SizeParseError
from planner import Chain, ChainError, InvalidScheduleError, Op, OpKind, Schedule
from tests.bad_input import (
    BAD_VALUES,
    CASES,
    FUZZ,
    STAGE_KEYS,
    api_error,
    chain_dict,
    cli_fails,
    cli_ok_or_fails,
    run_cli,
    stage,
    write_json,
)


@pytest.mark.parametrize("key", STAGE_KEYS)
@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_nan_negative_and_wrong_costs(tmp_path, key, value):
    data = chain_dict()
    data["stages"][1][key] = value
    path = write_json(tmp_path / "chain.json", data)
    error = api_error("chain cost", lambda: Chain.from_json(path), ChainError)
    assert key in str(error)
    cli_fails("chain cost", ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")], tmp_path)


@pytest.mark.parametrize("value", [float("nan"), -1, "800", None])
def test_bad_input_bytes(tmp_path, value):
    data = chain_dict()
    data["input_bytes"] = value
    api_error("chain cost", lambda: Chain.from_json(data), ChainError)


@pytest.mark.parametrize("stages", [[], [stage(name="loss")]], ids=["no-stage", "loss-only"])
def test_chain_of_length_zero(tmp_path, stages):
    path = write_json(tmp_path / "chain.json", {"name": "empty", "input_bytes": 8, "stages": stages})
    error = api_error("chain length", lambda: Chain.from_json(path), ChainError)
    assert "at least one stage" in str(error)
    cli_fails("chain length", ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")], tmp_path)


def test_chain_of_length_one_plans_or_says_the_budget_is_too_small(tmp_path):
    path = write_json(tmp_path / "chain.json", chain_dict(length=1))
    assert Chain.from_json(path).length == 1
    out = tmp_path / "s.json"
    CASES["chain length"] += 1
    code, text, err = run_cli(["plan", str(path), "--budget", "1GiB", "--out", str(out)])
    assert code == 0, err
    schedule = Schedule.from_json(out)
    assert [str(op) for op in schedule.ops] == ["F_all(1)", "F_all(2)", "B(2)", "B(1)"]
    out.unlink()
    line = cli_fails("chain length", ["plan", str(path), "--budget", "100B", "--out", str(out)], tmp_path)
    assert "100" in line and not out.exists()


@pytest.mark.parametrize("data", [
    {"input_bytes": 8}, {"stages": []}, {"input_bytes": 8, "stages": "s1,s2"}, {"input_bytes": 8, "stages": [1, 2]},
    {"input_bytes": 8, "stages": [{"forward_ms": 1}, stage()]}, [1, 2, 3], "chain", None,
    {"input_bytes": 8, "stages": [stage(output_bytes=100, saved_bytes=50), stage()]},
], ids=lambda d: json.dumps(d)[:30])
def test_malformed_chain_files(tmp_path, data):
    path = write_json(tmp_path / "chain.json", data)
    api_error("chain shape", lambda: Chain.from_json(path), ChainError)
    cli_fails("chain shape", ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")], tmp_path)


@pytest.mark.parametrize("text", ["{not json", "", "\x00\x01"], ids=["broken", "empty", "nul"])
def test_chain_files_that_are_not_json(tmp_path, text):
    path = tmp_path / "chain.json"
    path.write_text(text)
    api_error("chain shape", lambda: Chain.from_json(path), ChainError)
    cli_fails("chain shape", ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")], tmp_path)


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # json.loads recurses once per level


@pytest.mark.parametrize("target", ["meta", "chain", "schedule"])
def test_deeply_nested_json(work, tmp_path, target):
    path = work / "meta.json" if target == "meta" else tmp_path / f"{target}.json"
    path.write_text(DEEP_JSON)
    load = {"meta": lambda: load_trace(work), "chain": lambda: Chain.from_json(path),
            "schedule": lambda: Schedule.from_json(path)}[target]
    api_error("deep json", load, MemprofError)
    argv = {"meta": ["report", str(work)],
            "chain": ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")],
            "schedule": ["export", str(path), "--out", str(tmp_path / "apply.py")]}[target]
    cli_fails("deep json", argv, work, tmp_path)


_number = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**12) | st.none() | st.booleans()
           | st.text(max_size=3))


@FUZZ
@given(values=st.lists(st.fixed_dictionaries({k: _number for k in STAGE_KEYS}), min_size=0, max_size=4),
       input_bytes=_number)
def test_fuzzed_chains_are_valid_or_refused(values, input_bytes):
    CASES["fuzzed chain"] += 1
    try:
        chain = Chain.from_json({"name": "f", "input_bytes": input_bytes, "stages": values})
    except ChainError:
        return
    assert chain.length >= 1 and chain.input_bytes >= 0
    for s in chain.stages:
        assert all(math.isfinite(getattr(s, k)) and getattr(s, k) >= 0 for k in STAGE_KEYS)
        assert s.saved_bytes >= s.output_bytes


# ------------------------------------------------------------------------------------------- budgets

BAD_BUDGETS = ["-1", "0", "1e30", "64XB", "", "   ", "NaN", "inf", "-64MiB", "64 MiB MiB", "0x40", "1e400", "64MiBs",
               "0.0001B", "1,024", "½GiB"]


@pytest.mark.parametrize("budget", BAD_BUDGETS)
def test_bad_budgets(tmp_path, budget):
    if budget == "0.0001B":  # a positive fraction of a byte rounds up to one byte: accepted, then infeasible
        assert parse_bytes(budget) == 1
    else:
        api_error("budget", lambda: parse_bytes(budget), SizeParseError)
    chain = write_json(tmp_path / "chain.json", chain_dict())
    out = tmp_path / "s.json"
    if not budget.startswith("-") or budget == "-1":  # argparse reads "--budget -64MiB" as a missing value
        cli_fails("budget", ["plan", str(chain), "--budget", budget, "--out", str(out)], tmp_path)
    cli_fails("budget", ["plan", str(chain), f"--budget={budget}", "--out", str(out)], tmp_path)
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["plan", "chain.json", "--budget", "-64MiB", "--out", "s.json"],  # "-64MiB" looks like an option
    ["plan", "chain.json", "--out", "s.json"],  # --budget missing
    ["report"],  # RUN_DIR missing
    ["report", "run", "--iteration", "two"],
    ["frobnicate"],
], ids=lambda a: " ".join(a))
def test_usage_errors_are_one_line(tmp_path, argv):
    cli_fails("usage", argv, tmp_path)


@FUZZ
@given(text=st.text(max_size=12))
def test_fuzzed_budgets_parse_or_are_refused(text):
    CASES["budget"] += 1
    try:
        value = parse_bytes(text)
    except SizeParseError:
        return
    assert isinstance(value, int) and 0 < value < 2**63


# ----------------------------------------------------------------------------------------- schedules

@pytest.fixture()
def chain() -> Chain:
    return Chain.from_json(chain_dict(length=3))


def store_all(chain: Chain) -> list[Op]:
    top = chain.length + 1
    return [Op(OpKind.F_ALL, i) for i in range(1, top + 1)] + [Op(OpKind.B, i) for i in range(top, 0, -1)]


def schedule_dict(chain: Chain, ops: list) -> dict:
    data = Schedule("hand", 10**9, tuple(store_all(chain)), chain).to_dict()
    data["ops"] = ops
    return data


@pytest.mark.parametrize("ops", [
    [["F_all", 99]], [["F_all", 0]], [["B", -3]], [["F_all", "2"]], [["F_all", 2.5]], [["F_all", True]],
    [["F_foo", 1]], [["F_all", 1, 2]], [["F_all"]], "F_all(1)", [{"kind": "F_all", "stage": 1}], None,
], ids=lambda o: json.dumps(o)[:24])
def test_schedules_naming_stages_that_do_not_exist_or_malformed(tmp_path, chain, ops):
    path = write_json(tmp_path / "schedule.json", schedule_dict(chain, ops))
    api_error("schedule", lambda: Schedule.from_json(path), InvalidScheduleError)
    for out in ("apply.py", "copy.json"):
        cli_fails("schedule", ["export", str(path), "--out", str(tmp_path / out)], tmp_path)


@pytest.mark.parametrize("change", [
    {"format": "chrome-trace"}, {"version": 2}, {"version": 0}, {"chain": None}, {"budget_bytes": -1},
    {"predicted_makespan_ms": float("nan")},
], ids=lambda c: json.dumps(c, allow_nan=True))
def test_schedule_headers(tmp_path, chain, change):
    data = {**schedule_dict(chain, [[op.kind.value, op.stage] for op in store_all(chain)]), **change}
    path = write_json(tmp_path / "schedule.json", data)
    api_error("schedule", lambda: Schedule.from_json(path), MemprofError)
    cli_fails("schedule", ["export", str(path), "--out", str(tmp_path / "apply.py")], tmp_path)


BROKEN = {
    "backward-first": [["B", 1]],
    "no-backward": [["F_all", 1], ["F_all", 2], ["F_all", 3], ["F_all", 4]],
    "backward-before-its-forward": [["F_all", 1], ["F_all", 2], ["B", 4], ["F_all", 3], ["F_all", 4], ["B", 3],
                                    ["B", 2], ["B", 1]],
    "checkpointed-then-backward": [["F_ck", 1], ["F_all", 2], ["F_all", 3], ["F_all", 4], ["B", 4], ["B", 3], ["B", 2],
                                   ["B", 1]],
    "input-dropped": [["F_all", 1], ["F_none", 2], ["F_all", 3], ["F_all", 4], ["B", 4], ["B", 3], ["B", 2],
                      ["B", 1]],
    "ends-early": [["F_all", 1], ["F_all", 2], ["F_all", 3], ["F_all", 4], ["B", 4], ["B", 3]],
    "empty": [],
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_schedules_that_break_dependencies(tmp_path, chain, name):
    from planner.export.files import export_python
    from planner.simulation.simulator import simulate

    path = write_json(tmp_path / "schedule.json", schedule_dict(chain, BROKEN[name]))
    schedule = Schedule.from_json(path)  # well-formed: the dependencies are the simulator's job
    api_error("broken schedule", lambda: simulate(chain, schedule), InvalidScheduleError)
    api_error("broken schedule", lambda: export_python(schedule), InvalidScheduleError)
    cli_fails("broken schedule", ["export", str(path), "--out", str(tmp_path / "apply.py")], tmp_path)


@pytest.mark.parametrize("name", ["backward-first", "input-dropped"])
def test_json_export_of_a_broken_schedule_fails(tmp_path, chain, name):
    data = schedule_dict(chain, BROKEN[name])
    data.update(predicted_peak_bytes=1, predicted_makespan_ms=1.0)  # as if written by an older or other tool
    path = write_json(tmp_path / "schedule.json", data)
    cli_fails("broken schedule", ["export", str(path), "--out", str(tmp_path / "copy.json")], tmp_path)


_ops = st.lists(st.tuples(st.sampled_from([k.value for k in OpKind]), st.integers(1, 5)), max_size=10)


@settings(max_examples=60, deadline=None)
@given(ops=_ops)
def test_fuzzed_schedules_simulate_or_raise_and_the_cli_agrees(ops):
    from planner.simulation.simulator import simulate

    chain = Chain.from_json(chain_dict(length=3))
    CASES["fuzzed schedule"] += 1
    try:
        schedule = Schedule.from_json(schedule_dict(chain, [list(op) for op in ops]))
        simulate(chain, schedule)
        valid = True
    except InvalidScheduleError:
        valid = False
    with tempfile.TemporaryDirectory() as tmp:
        path = write_json(Path(tmp) / "schedule.json", schedule_dict(chain, [list(op) for op in ops]))
        out = Path(tmp) / "apply.py"
        code = cli_ok_or_fails("fuzzed schedule", ["export", str(path), "--out", str(out)], Path(tmp))
        assert (code == 0) == valid == out.exists()


def test_schedule_for_another_chain(tmp_path, chain):
    from planner.simulation.simulator import simulate

    other = Chain.from_json(chain_dict(length=4))
    schedule = Schedule("hand", None, tuple(store_all(chain)), chain)
    api_error("schedule", lambda: simulate(other, schedule), MemprofError)


