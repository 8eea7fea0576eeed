"""``weight_copies`` and ``comm_buffers`` in the dashboard: a colour each, a band in every stack, and runs written
before they existed drawn with them at zero."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from dashboard.data import TraceStore
from dashboard.figures import CATEGORY_COLORS
from dashboard.figures_overview import breakdown_figure
from dashboard.figures_timeline import timeline_figure
from memprof.categories import CATEGORY_COLUMNS
from tests.dashboard.fixtures import write_profiled_run

NEW = ("weight_copies", "comm_buffers")


def test_every_category_has_a_colour_of_its_own() -> None:
    assert list(CATEGORY_COLORS) == list(CATEGORY_COLUMNS)  # legend and stack in the categories' order
    assert len(set(CATEGORY_COLORS.values())) == len(CATEGORY_COLORS)


def _drop_new_columns(run: Path) -> None:
    """Rewrites the run's parts as a memprof from before the two categories wrote them."""
    for table, columns in (("iterations", NEW), ("events", NEW), ("layers", ("weight_copy_bytes", "comm_buffer_bytes"))):
        for part in (run / f"{table}.parquet").glob("part-*.parquet"):
            pq.write_table(pq.read_table(part).drop_columns(list(columns)), part)


def test_a_run_from_before_the_new_categories_draws_them_at_zero(tmp_path: Path) -> None:
    write_profiled_run(tmp_path / "old", "old", iterations=2)
    _drop_new_columns(tmp_path / "old")
    store = TraceStore(tmp_path)
    frame = store.timeline("old", 1)
    timeline = {t.name: t for t in timeline_figure(frame).data}
    overview = {t.name: t for t in breakdown_figure(store.iterations("old")).data}
    for name in NEW:
        assert (frame[name] == 0).all()
        assert timeline[name].stackgroup == "allocated" and not np.asarray(timeline[name].y).any()
        assert timeline[name].line.color == CATEGORY_COLORS[name]
        assert name in overview
    stacked = sum(np.asarray(timeline[c].y) for c in CATEGORY_COLUMNS)
    assert stacked.tolist() == frame["allocated_bytes"].tolist()
    layers = store.layers_at("old", 1)
    assert (layers.weight_copy_bytes == 0).all() and (layers.comm_buffer_bytes == 0).all()
