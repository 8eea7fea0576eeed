"""What importing memprof costs: the background worker and the reader must not pay for torch (or pandas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MEMPROF = Path(__file__).resolve().parents[2] / "memprof"
ANALYSIS = sorted(f"memprof.analysis.{p.stem}" for p in (MEMPROF / "analysis").glob("*.py") if p.stem != "__init__")
#: What ``python -m memprof.trace.pipeline.worker`` imports, and what it needs to write a part.
WORKER_SIDE = ["memprof.schema", "memprof.trace.pipeline.journal", "memprof.trace.pipeline.worker", "memprof.trace.format.writer",
               "memprof.trace.format.compaction"]


def _loaded_after(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    """The ``heavy`` modules a fresh interpreter has loaded after importing ``modules``."""
    code = (f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(h for h in {heavy!r} if h in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def test_import_memprof_loads_no_heavy_library() -> None:
    assert _loaded_after(["memprof"], ("torch", "pandas", "pyarrow")) == []


@pytest.mark.parametrize("module", ANALYSIS + WORKER_SIDE)
def test_the_worker_side_imports_neither_torch_nor_pandas(module: str) -> None:
    # the worker starts with every profiled run: a lean start keeps close() and short runs quick
    assert _loaded_after([module], ("torch", "pandas")) == []


def test_the_reader_imports_no_torch() -> None:
    assert _loaded_after(["memprof.trace.reader", "memprof.trace.pipeline.recovery", "memprof.trace.ranks"], ("torch",)) == []


def test_snapshot_interop_imports_no_torch() -> None:
    # memprof import-snapshot and export-snapshot run where torch (or CUDA) is not installed
    modules = ["memprof.interop.importer", "memprof.interop.exporter", "memprof.interop.snapshot_file"]
    assert _loaded_after(modules, ("torch",)) == []


def test_the_trainer_integrations_are_not_imported_by_memprof() -> None:
    # transformers and lightning are optional extras: only memprof.integrations.<framework> imports them
    heavy = ("torch", "transformers", "accelerate", "lightning")
    assert _loaded_after(["memprof", "memprof.integrations"], heavy) == []
