"""Hostile module names (HTML, Unicode, control characters) come back unchanged from the trace and the report."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from examples import zoo
from memprof import (
    MemoryProfiler,
    load_trace,
)
from tests.bad_input import CASES, run_cli

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

