"""Shared by the bad-input tests of every package: the cases counted, the checks, a profiled run to damage.

Every case must end in a specific exception from the API (a :class:`memprof.errors.MemprofError` subclass,
:class:`memprof.units.SizeParseError` included) or, from the command line, exit code 2 with exactly one line on
stderr and no traceback, and no file on disk may change when a command fails. ``CASES`` counts every case
tried, hypothesis examples included; the total is printed at the end of the session (run with ``-s``) and
recorded as the test-suite property ``bad_input_cases``. The fixtures ``run_dir`` and ``work`` are registered
for every test by ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, settings

from cli.main import main
from examples import zoo
from memprof import (
    MemoryProfiler,
    MemprofError,
    load_trace,
)
from memprof.schema import TABLES
from memprof.units import SizeParseError

CASES: Counter[str] = Counter()
#: Outcomes of fuzzed cases that are not failures (e.g. a bit flip that Parquet cannot detect).
NOTED: Counter[str] = Counter()
#: Exceptions that fuzzing may still meet (none left: each was fixed and is pinned by its own test).
KNOWN_GAPS: tuple[type[Exception], ...] = ()
EXPECTED = (MemprofError, SizeParseError)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="session", autouse=True)
def _report_count(record_testsuite_property):
    yield
    total = sum(CASES.values())
    if not total:
        return
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


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, allow_nan=True))  # NaN and Infinity as JSON's common extension
    return path

