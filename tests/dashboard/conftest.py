"""Fixtures of the dashboard tests: a folder of small synthetic runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.data import TraceStore
from tests.dashboard.fixtures import Traces, make_traces


@pytest.fixture
def traces(tmp_path: Path) -> Traces:
    """The synthetic runs of :mod:`tests.dashboard.fixtures`, in a fresh folder."""
    return make_traces(tmp_path / "traces")


@pytest.fixture
def store(traces: Traces) -> TraceStore:
    """A trace store over those runs."""
    return TraceStore(traces.root)
