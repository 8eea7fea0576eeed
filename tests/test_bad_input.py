"""Bad input, tried, with nothing lost: the reader, the planner's file formats and the ``memprof`` command.

Every case must end in a specific exception from the API (a :class:`memprof.errors.MemprofError` subclass,
:class:`memprof.units.SizeParseError` included) or, from the command line, exit code 2 with exactly one line on
stderr and no traceback, and no file on disk may change when a command fails. ``CASES`` counts every case
tried, hypothesis examples included; the total is printed at the end of the module (run with ``-s``) and
recorded as the test-suite property ``bad_input_cases``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from cli.main import main
from memprof import (
    CorruptTraceError,
    MemoryProfiler,
    MemprofError,
    SchemaVersionError,
    TraceError,
    TraceNotFoundError,
    list_runs,
    load_trace,
    parse_bytes,
    zoo,
)
from memprof.trace.schema import SCHEMAS, TABLES
from memprof.units import SizeParseError
from planner import Chain, ChainError, InvalidScheduleError, Op, OpKind, Schedule

CASES: Counter[str] = Counter()
#: Outcomes of fuzzed cases that are not failures (e.g. a bit flip that Parquet cannot detect).
NOTED: Counter[str] = Counter()
#: Exceptions that fuzzing may still meet (none left: each was fixed and is pinned by its own test).
KNOWN_GAPS: tuple[type[Exception], ...] = ()
EXPECTED = (MemprofError, SizeParseError)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _report_count(record_testsuite_property):
    yield
    total = sum(CASES.values())
    record_testsuite_property("bad_input_cases", total)
    print(f"\nbad-input cases tried: {total} ({', '.join(f'{k} {v}' for k, v in sorted(CASES.items()))}); "
          f"noted: {dict(NOTED)}")


# ------------------------------------------------------------------------------------------- helpers

def snapshot(*paths: Path) -> dict[str, tuple[str, int]]:
    """Content hash and modification time of every file under ``paths`` (hidden files included)."""
    found: dict[str, tuple[str, int]] = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            found[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return found


def api_error(kind: str, fn, expected: type[Exception] | tuple = EXPECTED) -> Exception:
    """Runs ``fn`` and returns the exception it must raise: ``expected``, itself one of ours."""
    CASES[kind] += 1
    with pytest.raises(expected) as info:
        fn()
    assert isinstance(info.value, EXPECTED), f"{type(info.value).__name__} is not a memprof error"
    return info.value


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``memprof ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def cli_fails(kind: str, argv: list[str], *protected: Path) -> str:
    """Asserts that ``memprof ARGV`` exits 2 with one stderr line and changes nothing; returns the line."""
    CASES[kind] += 1
    before = snapshot(*protected)
    code, out, err = run_cli(argv)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert code == 2, f"memprof {argv}: exit {code}, stdout {out!r}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("memprof"), f"expected one line on stderr, found {err!r}"
    assert snapshot(*protected) == before, f"memprof {argv} changed files although it failed"
    return lines[0]


def cli_ok_or_fails(kind: str, argv: list[str], *protected: Path, one_line: bool = True) -> int:
    """``memprof ARGV`` succeeds, or fails the way :func:`cli_fails` requires; returns the exit code.

    ``one_line=False`` accepts an error message that spans lines (see
    ``test_parquet_errors_are_one_line``), everything else being required.
    """
    before = snapshot(*protected)
    code, out, err = run_cli(argv)
    CASES[kind] += 1
    assert "Traceback" not in out + err
    if code != 0:
        lines = err.strip().splitlines()
        assert code == 2 and lines and lines[0].startswith(f"memprof {argv[0]}: error: "), (code, err)
        assert len(lines) == 1 or not one_line, f"expected one line on stderr, found {err!r}"
        assert snapshot(*protected) == before
    return code


def copy_run(run_dir: Path, into: Path) -> Path:
    target = into / run_dir.name
    shutil.copytree(run_dir, target)
    return target


def parts(run_dir: Path, table: str) -> list[Path]:
    return sorted((run_dir / f"{table}.parquet").glob("part-*.parquet"))


def read_everything(run_dir: Path) -> dict[str, pd.DataFrame]:
    """Opens the run and reads every table."""
    trace = load_trace(run_dir)
    return {table: getattr(trace, table) for table in TABLES}


def same_tables(left: dict[str, pd.DataFrame], right: dict[str, pd.DataFrame]) -> bool:
    return all(left[t].reset_index(drop=True).equals(right[t].reset_index(drop=True)) for t in TABLES)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real profiled run of a small MLP (3 iterations)."""
    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=32, in_features=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path_factory.mktemp("traces"), print_period=0) as profiler:
        for _ in range(3):
            zoo.train_step(model, optimizer, make_batch(8))
            profiler.record_stats()
    return profiler.run_dir


@pytest.fixture()
def work(tmp_path, run_dir) -> Path:
    """A private copy of the run, to damage."""
    return copy_run(run_dir, tmp_path)


# ---------------------------------------------------------------------------- damaged Parquet parts

@FUZZ
@given(data=st.data())
def test_truncated_parts_are_corrupt_traces(run_dir, data):
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_run(run_dir, Path(tmp))
        part = data.draw(st.sampled_from([p for t in TABLES for p in parts(work, t)]))
        size = part.stat().st_size
        part.write_bytes(part.read_bytes()[: data.draw(st.integers(0, size - 1))])
        error = api_error("truncated part", lambda: load_trace(work), CorruptTraceError)
        assert part.name in str(error)
        line = cli_fails("truncated part", ["report", str(work)], work)
        assert "not a readable Parquet file" in line


@FUZZ
@given(data=st.data())
def test_bit_flipped_parts_are_read_or_refused(run_dir, data):
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_run(run_dir, Path(tmp))
        part = data.draw(st.sampled_from([p for t in TABLES for p in parts(work, t)]))
        raw = bytearray(part.read_bytes())
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
        part.write_bytes(bytes(raw))
        CASES["bit flip"] += 1
        try:
            read = read_everything(work)
            # Parquet pages carry no checksum unless asked to: see docs/reliability.md.
            same = same_tables(read, read_everything(run_dir))
            NOTED["bit flip read, data unchanged" if same else "bit flip read, data silently changed"] += 1
        except TraceError:
            NOTED["bit flip refused"] += 1
        except KNOWN_GAPS:
            NOTED["bit flip known gap"] += 1
            return
        cli_ok_or_fails("bit flip", ["report", str(work)], work)


def test_invalid_utf8_in_a_footer_is_a_corrupt_trace(work):
    part = parts(work, "layers")[0]
    raw = part.read_bytes()
    assert raw.count(b"feature_map_bytes") >= 1  # the column name, in the footer (the data is compressed)
    part.write_bytes(raw.replace(b"feature_map_bytes", b"\xdfeature_map_bytes"))  # same length, not UTF-8
    api_error("bit flip", lambda: load_trace(work), CorruptTraceError)
    cli_fails("bit flip", ["report", str(work)], work)


def test_parquet_errors_are_one_line(work):
    part = parts(work, "iterations")[0]
    raw = bytearray(part.read_bytes())
    raw[8:16] = bytes(b ^ 0xFF for b in raw[8:16])  # the first page header, right after the "PAR1" magic
    part.write_bytes(bytes(raw))
    api_error("bit flip", lambda: read_everything(work), CorruptTraceError)
    cli_fails("bit flip", ["report", str(work)], work)


@pytest.mark.parametrize("content", [
    b"iteration,epoch,step_ms\n0,0,1.5\n",  # a CSV renamed .parquet
    b'{"traceEvents": []}',  # a Chrome trace renamed .parquet
    b"",
    b"PAR1",
    b"PAR1PAR1",
    b"\x89PNG\r\n\x1a\n" + bytes(64),
], ids=["csv", "json", "empty", "magic-only", "two-magics", "png"])
@pytest.mark.parametrize("table", TABLES)
def test_files_from_other_tools_as_parts(work, table, content):
    parts(work, table)[0].write_bytes(content)
    api_error("foreign part", lambda: load_trace(work), CorruptTraceError)
    cli_fails("foreign part", ["report", str(work)], work)


def test_feather_file_renamed_parquet(work):
    frame = load_trace(work).events
    import pyarrow.feather as feather

    feather.write_feather(frame, parts(work, "events")[0])
    api_error("foreign part", lambda: load_trace(work), CorruptTraceError)
    cli_fails("foreign part", ["report", str(work)], work)


def _rewrite(part: Path, change) -> None:
    table = pq.read_table(part)
    pq.write_table(change(table), part)


@pytest.mark.parametrize("table,column", [(t, c) for t in TABLES for c in SCHEMAS[t].names])
def test_missing_columns_are_named(work, table, column):
    _rewrite(parts(work, table)[-1], lambda t: t.drop_columns([column]))
    error = api_error("missing column", lambda: load_trace(work), CorruptTraceError)
    assert column in str(error)
    cli_fails("missing column", ["report", str(work)], work)


@pytest.mark.parametrize("table", TABLES)
def test_extra_columns_are_kept(work, table):
    CASES["extra column"] += 1
    _rewrite(parts(work, table)[0], lambda t: t.append_column("from_a_newer_tool", pa.array(["x"] * t.num_rows)))
    frame = getattr(load_trace(work), table)
    assert "from_a_newer_tool" in frame.columns
    assert run_cli(["report", str(work)])[0] == 0


@pytest.mark.parametrize("table,column", [
    ("iterations", "peak_allocated_bytes"), ("iterations", "iteration"), ("layers", "output_bytes"),
    ("layers", "module"), ("events", "allocated_bytes"), ("events", "time_ns"),
])
def test_columns_of_the_wrong_type(work, table, column):
    """A column with the right name but strings (or numbers) inside: refused when the trace is opened."""

    def retype(t: pa.Table) -> pa.Table:
        index = t.schema.get_field_index(column)
        values = t.column(column).to_pylist()
        wrong = pa.array([f"<{v}>" for v in values]) if not pa.types.is_string(t.schema.field(index).type) \
            else pa.array(list(range(len(values))))
        return t.set_column(index, column, wrong)

    for part in parts(work, table):
        _rewrite(part, retype)
    error = api_error("wrong column type", lambda: load_trace(work), CorruptTraceError)
    assert column in str(error)
    cli_fails("wrong column type", ["report", str(work)], work)


# --------------------------------------------------------------------------------------- meta.json

FOREIGN_META = {
    "chrome-trace": '{"traceEvents": [], "displayTimeUnit": "ms"}',
    "package-json": '{"name": "x", "version": "1.0.0", "dependencies": {}}',
    "list": "[1, 2, 3]",
    "string": '"memprof-trace"',
    "null": "null",
    "csv": "run_id,model\nx,y\n",
    "empty": "",
    "utf16": '{"format": "memprof-trace"}'.encode("utf-16").decode("latin-1"),
    "truncated": '{"format": "memprof-trace", "schema_vers',
}


@pytest.mark.parametrize("name", list(FOREIGN_META))
def test_meta_json_from_other_tools(work, name):
    (work / "meta.json").write_text(FOREIGN_META[name], encoding="latin-1")
    api_error("foreign meta", lambda: load_trace(work), CorruptTraceError)
    cli_fails("foreign meta", ["report", str(work)], work)
    assert next(r for r in list_runs(work.parent) if r.path == work).error  # listed with its error


@FUZZ
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                          lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=20))
def test_any_json_as_meta_is_refused(run_dir, value):
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_run(run_dir, Path(tmp))
        (work / "meta.json").write_text(json.dumps(value))
        api_error("fuzzed meta", lambda: load_trace(work), TraceError)


@FUZZ
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_meta_are_refused(run_dir, raw):
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_run(run_dir, Path(tmp))
        (work / "meta.json").write_bytes(raw)
        api_error("fuzzed meta", lambda: load_trace(work), TraceError)


def _edit_meta(run: Path, **changes) -> None:
    meta = json.loads((run / "meta.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            meta.pop(key)
        else:
            meta[key] = value
    (run / "meta.json").write_text(json.dumps(meta))


_DELETE = object()


@pytest.mark.parametrize("version", [0, 2, 999, -1, "1", None, 1.5, _DELETE])
def test_schema_versions_old_and_new(work, version):
    _edit_meta(work, schema_version=version)
    error = api_error("schema version", lambda: load_trace(work), SchemaVersionError)
    if version in (2, 999):
        assert "upgrade memprof" in str(error)
    line = cli_fails("schema version", ["report", str(work)], work)
    assert "schema_version" in line


@pytest.mark.parametrize("key", ["run_id", "created_at", "device", "torch_version", "model", "rank", "world_size"])
def test_meta_missing_a_required_key(work, key):
    _edit_meta(work, **{key: _DELETE})
    error = api_error("meta key", lambda: load_trace(work), CorruptTraceError)
    assert key in str(error)
    cli_fails("meta key", ["report", str(work)], work)


def test_missing_or_misplaced_run_directories(tmp_path, work):
    api_error("missing run", lambda: load_trace(tmp_path / "absent"), TraceNotFoundError)
    cli_fails("missing run", ["report", str(tmp_path / "absent")], tmp_path)
    (work / "meta.json").unlink()
    (work / "meta.json").mkdir()  # a directory where the file should be
    api_error("missing run", lambda: load_trace(work), TraceNotFoundError)
    cli_fails("missing run", ["report", str(work)], work)
    a_file = tmp_path / "run.txt"
    a_file.write_text("not a directory")
    api_error("missing run", lambda: load_trace(a_file), TraceNotFoundError)
    cli_fails("missing run", ["report", str(a_file)], tmp_path)


# ---------------------------------------------------------------------------------------- empty runs

def test_empty_run_reads_as_empty_tables(work, tmp_path):
    for table in TABLES:
        shutil.rmtree(work / f"{table}.parquet")
    CASES["empty run"] += 1
    trace = load_trace(work)
    for table in TABLES:
        frame = getattr(trace, table)
        assert frame.empty and list(frame.columns) == SCHEMAS[table].names
    code, out, _ = run_cli(["report", str(work)])
    assert code == 0 and "no iteration recorded" in out
    out_file = tmp_path / "schedule.json"
    cli_fails("empty run", ["plan", str(work), "--budget", "64MiB", "--out", str(out_file)], tmp_path)
    assert not out_file.exists()


def test_run_with_empty_table_directories(work):
    for table in TABLES:
        for part in parts(work, table):
            part.unlink()
    CASES["empty run"] += 1
    assert load_trace(work).iterations.empty
    assert run_cli(["report", str(work)])[0] == 0


# -------------------------------------------------------------------------------------------- chains

def stage(**overrides) -> dict:
    base = {"name": "s", "forward_ms": 1.0, "backward_ms": 2.0, "output_bytes": 1000, "saved_bytes": 1500,
            "grad_bytes": 1000, "forward_overhead_bytes": 10, "backward_overhead_bytes": 20}
    return {**base, **overrides}


def chain_dict(length: int = 3) -> dict:
    return {"name": "hand", "input_bytes": 800,
            "stages": [stage(name=f"s{i}") for i in range(1, length + 1)] + [stage(name="loss", output_bytes=4,
                                                                                   saved_bytes=4, grad_bytes=4)]}


BAD_VALUES = [float("nan"), float("inf"), -float("inf"), -1, -0.5, "12", None, True, [], {}]
STAGE_KEYS = ["forward_ms", "backward_ms", "output_bytes", "saved_bytes", "grad_bytes", "forward_overhead_bytes",
              "backward_overhead_bytes"]


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, allow_nan=True))  # NaN and Infinity as JSON's common extension
    return path


@pytest.mark.parametrize("key", STAGE_KEYS)
@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_nan_negative_and_wrong_costs(tmp_path, key, value):
    data = chain_dict()
    data["stages"][1][key] = value
    path = _write_json(tmp_path / "chain.json", data)
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
    path = _write_json(tmp_path / "chain.json", {"name": "empty", "input_bytes": 8, "stages": stages})
    error = api_error("chain length", lambda: Chain.from_json(path), ChainError)
    assert "at least one stage" in str(error)
    cli_fails("chain length", ["plan", str(path), "--budget", "1GiB", "--out", str(tmp_path / "s.json")], tmp_path)


def test_chain_of_length_one_plans_or_says_the_budget_is_too_small(tmp_path):
    path = _write_json(tmp_path / "chain.json", chain_dict(length=1))
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
    path = _write_json(tmp_path / "chain.json", data)
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
    chain = _write_json(tmp_path / "chain.json", chain_dict())
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
    path = _write_json(tmp_path / "schedule.json", schedule_dict(chain, ops))
    api_error("schedule", lambda: Schedule.from_json(path), InvalidScheduleError)
    for out in ("apply.py", "copy.json"):
        cli_fails("schedule", ["export", str(path), "--out", str(tmp_path / out)], tmp_path)


@pytest.mark.parametrize("change", [
    {"format": "chrome-trace"}, {"version": 2}, {"version": 0}, {"chain": None}, {"budget_bytes": -1},
    {"predicted_makespan_ms": float("nan")},
], ids=lambda c: json.dumps(c, allow_nan=True))
def test_schedule_headers(tmp_path, chain, change):
    data = {**schedule_dict(chain, [[op.kind.value, op.stage] for op in store_all(chain)]), **change}
    path = _write_json(tmp_path / "schedule.json", data)
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
    from planner.export import export_python
    from planner.simulator import simulate

    path = _write_json(tmp_path / "schedule.json", schedule_dict(chain, BROKEN[name]))
    schedule = Schedule.from_json(path)  # well-formed: the dependencies are the simulator's job
    api_error("broken schedule", lambda: simulate(chain, schedule), InvalidScheduleError)
    api_error("broken schedule", lambda: export_python(schedule), InvalidScheduleError)
    cli_fails("broken schedule", ["export", str(path), "--out", str(tmp_path / "apply.py")], tmp_path)


@pytest.mark.parametrize("name", ["backward-first", "input-dropped"])
def test_json_export_of_a_broken_schedule_fails(tmp_path, chain, name):
    data = schedule_dict(chain, BROKEN[name])
    data.update(predicted_peak_bytes=1, predicted_makespan_ms=1.0)  # as if written by an older or other tool
    path = _write_json(tmp_path / "schedule.json", data)
    cli_fails("broken schedule", ["export", str(path), "--out", str(tmp_path / "copy.json")], tmp_path)


_ops = st.lists(st.tuples(st.sampled_from([k.value for k in OpKind]), st.integers(1, 5)), max_size=10)


@settings(max_examples=60, deadline=None)
@given(ops=_ops)
def test_fuzzed_schedules_simulate_or_raise_and_the_cli_agrees(ops):
    from planner.simulator import simulate

    chain = Chain.from_json(chain_dict(length=3))
    CASES["fuzzed schedule"] += 1
    try:
        schedule = Schedule.from_json(schedule_dict(chain, [list(op) for op in ops]))
        simulate(chain, schedule)
        valid = True
    except InvalidScheduleError:
        valid = False
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_json(Path(tmp) / "schedule.json", schedule_dict(chain, [list(op) for op in ops]))
        out = Path(tmp) / "apply.py"
        code = cli_ok_or_fails("fuzzed schedule", ["export", str(path), "--out", str(out)], Path(tmp))
        assert (code == 0) == valid == out.exists()


def test_schedule_for_another_chain(tmp_path, chain):
    from planner.simulator import simulate

    other = Chain.from_json(chain_dict(length=4))
    schedule = Schedule("hand", None, tuple(store_all(chain)), chain)
    api_error("schedule", lambda: simulate(other, schedule), MemprofError)


# ------------------------------------------------------------------------------------ CLI arguments

def test_unknown_algorithm_container_and_slots(tmp_path, run_dir):
    chain = _write_json(tmp_path / "chain.json", chain_dict())
    out = str(tmp_path / "s.json")
    base = ["plan", str(chain), "--budget", "64MiB", "--out", out]
    cli_fails("cli option", [*base, "--algorithm", "magic"], tmp_path)
    cli_fails("cli option", [*base, "--slots", "0"], tmp_path)
    cli_fails("cli option", [*base, "--slots", "many"], tmp_path)
    cli_fails("cli option", [*base, "--container", "features"], tmp_path)
    cli_fails("cli option", ["plan", str(run_dir), "--budget", "64MiB", "--out", out, "--container", "nope"],
              tmp_path, run_dir)
    cli_fails("cli option", ["plan", str(run_dir), "--budget", "64MiB", "--out", str(tmp_path / "no" / "s.json")],
              tmp_path, run_dir)
    cli_fails("cli option", ["report", str(run_dir), "--iteration", "99"], run_dir)


def test_failed_plan_keeps_an_existing_output(tmp_path):
    chain = _write_json(tmp_path / "chain.json", chain_dict())
    out = tmp_path / "s.json"
    out.write_text("a schedule the user keeps")
    cli_fails("cli option", ["plan", str(chain), "--budget", "1B", "--out", str(out)], tmp_path)
    assert out.read_text() == "a schedule the user keeps"


def test_the_console_command_prints_one_line(tmp_path):
    """The installed ``memprof`` command, in its own process, behaves like ``main``."""
    command = Path(sys.executable).with_name("memprof")
    if not command.exists():
        pytest.skip("the memprof console command is not installed in this environment")
    chain = _write_json(tmp_path / "chain.json", chain_dict())
    for argv in (["report", str(tmp_path / "absent")],
                 ["plan", str(chain), "--budget", "64XB", "--out", str(tmp_path / "s.json")]):
        CASES["console command"] += 1
        done = subprocess.run([str(command), *argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "s.json").exists()


# ------------------------------------------------------------------------------ module names

HOSTILE_NAMES = ['<script>alert("x")</script>', "<img src=x onerror=alert(1)>", "a&amp;b", "quote'\"`",
                 "ünïcödé", "層_🧠", "\u202eevil", "zero\u200bwidth", "e\u0301", "tab\tname", "sp ace"]


class Wide(nn.Module):
    """Children with arbitrary names, applied in order."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        for name in names:
            self.add_module(name, nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
        self.names = list(names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            x = self.get_submodule(name)(x) if "." not in name else x
        return x


def profile_names(names: list[str], out_dir: Path) -> Path:
    model = Wide(names)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=out_dir, run_id="names", print_period=0) as profiler:
        zoo.train_step(model, optimizer, (torch.randn(2, 4), torch.randint(0, 4, (2,))))
        profiler.record_stats()
    return profiler.run_dir


def assert_names_round_trip(run: Path, names: list[str]) -> None:
    trace = load_trace(run)
    expected = {""} | set(names) | {f"{n}.{i}" for n in names for i in (0, 1)}
    assert set(trace.layers.module) == expected
    assert set(trace.layers.parent) - {""} <= set(names) | {""}
    assert set(trace.events.module) <= expected and set(names) <= set(trace.events.module)
    assert set(pd.read_parquet(run / "layers.parquet").module) == expected  # other readers see the same


def test_html_and_unicode_module_names_round_trip(tmp_path):
    CASES["module names"] += 1
    run = profile_names(HOSTILE_NAMES, tmp_path)
    assert_names_round_trip(run, HOSTILE_NAMES)
    code, out, _ = run_cli(["report", str(run), "--top", "50"])
    assert code == 0 and '<script>alert("x")</script>' in out and "層_🧠" in out


# Printable characters of every script, punctuation (HTML's <>&"' included) and symbols; "." separates names.
_name = st.text(st.characters(whitelist_categories=("L", "M", "N", "P", "S", "Zs"), blacklist_characters="."),
                min_size=1, max_size=10)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(_name, min_size=1, max_size=3, unique=True))
def test_fuzzed_module_names_round_trip(names):
    blocked = set(dir(Wide([])))
    names = [n for n in names if n not in blocked and n.isprintable()]
    if not names:
        return
    CASES["module names"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        assert_names_round_trip(profile_names(names, Path(tmp)), names)

