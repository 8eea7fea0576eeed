"""The planner's public API: what ``planner`` exports, and what importing it costs."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import planner
import planner.errors
import planner.executor
import planner.solvers

TOY = Path(__file__).with_name("toy_chain.json")
ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_name_resolves() -> None:
    missing = [name for name in planner.__all__ if getattr(planner, name, None) is None]
    assert not missing
    assert callable(planner.solve) and callable(planner.chain_from_trace)  # the function, not a module


def test_exports_are_sorted() -> None:
    for package in (planner, planner.executor, planner.solvers):
        assert package.__all__ == sorted(package.__all__), package.__name__
        assert len(set(package.__all__)) == len(package.__all__), package.__name__


def test_every_planner_error_is_exported() -> None:
    defined = [name for name, value in vars(planner.errors).items()
               if inspect.isclass(value) and issubclass(value, BaseException)
               and value.__module__ == "planner.errors"]
    assert set(defined) - set(planner.__all__) == set()
    assert {"SearchTooLargeError", "TableTooLargeError"} <= set(defined)


def test_unknown_names_raise_attribute_error() -> None:
    try:
        planner.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("planner.no_such_name resolved")


def test_solving_a_json_chain_imports_neither_torch_nor_pandas() -> None:
    script = f"""
import json, sys
import planner
chain = planner.Chain.from_json({str(TOY)!r})
schedule = planner.solve(chain, planner.store_all_budget(chain), "rotor")
planner.simulate(chain, schedule)
planner.Schedule.from_json(schedule.to_json())
print(json.dumps(sorted(m for m in ("torch", "pandas") if m in sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
