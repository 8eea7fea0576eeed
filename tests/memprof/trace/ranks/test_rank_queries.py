"""Every query that docs/trace-format.md ("Many ranks") shows, run on a synthetic run and checked against the reference.

The queries are read from the document itself, so the documented text is what is tested: each
``###`` question has a DuckDB block and a pyarrow block, and both must give the reference's answer.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from memprof.schema import LAYERS
from memprof.trace.ranks import rank_summary
from tests.memprof.trace.ranks.many_ranks import (
    documented_queries,
    reference_frame,
    reference_summary,
    setup_code,
    write_many_ranks,
)

DETAILED_ITERATION = 500  # the iteration the layers query names
QUERIES = documented_queries()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 ranks, merged parts of several row groups, a rewritten tail (copies), layers for 3 iterations."""
    return write_many_ranks(tmp_path_factory.mktemp("doc") / "run", 4, 2500, part_rows=700, row_group_rows=256,
                            rewritten=120, detailed=(0, DETAILED_ITERATION, 2000))


def expected(title: str, run: Path) -> list[tuple]:
    """The reference's answer to one documented question (from every rank loaded whole)."""
    frame = reference_frame(run)
    if title.startswith("Which rank peaked highest"):
        top = frame.sort_values(["peak_allocated_bytes", "rank", "iteration"], ascending=[False, True, True])
        return _rows(top[["rank", "iteration", "peak_allocated_bytes", "peak_module", "peak_phase"]].head(1))
    if title.startswith("Each rank's peak: where"):
        return _rows(reference_summary(run))
    if title.startswith("Each rank's peak over time"):
        buckets = frame.assign(first_iteration=frame.iteration // 1000 * 1000)
        return _rows(buckets.groupby(["rank", "first_iteration"], as_index=False).peak_allocated_bytes.max())
    if title.startswith("The modules that save the most"):
        layers = reference_frame(run, LAYERS)
        layers = layers[(layers.iteration == DETAILED_ITERATION) & (layers.module != "")]
        rows = []
        for module, own in layers.groupby("module"):
            top = own.saved_bytes.max()
            rows.append((module, top, own[own.saved_bytes == top]["rank"].min(), own["rank"].nunique()))
        return sorted(rows, key=lambda r: (-r[1], r[0]))[:5]
    raise AssertionError(f"no reference for the documented question {title!r}; add one here")


def _rows(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(row) for row in frame.itertuples(index=False)]


def _plain(rows: list[tuple]) -> list[tuple]:
    return [tuple(int(v) if hasattr(v, "__int__") and not isinstance(v, str) else v for v in row) for row in rows]


def test_the_section_documents_four_questions():
    assert len(QUERIES) == 4
    assert all("read_parquet('<run>/rank=*/" in sql and "hive_partitioning = true" in sql for sql, _ in QUERIES.values())


@pytest.mark.parametrize("title", list(QUERIES))
def test_the_duckdb_query_gives_the_reference_answer(run, title):
    duckdb = pytest.importorskip("duckdb")
    sql = QUERIES[title][0].replace("<run>", str(run))
    found = duckdb.sql(sql).fetchall()
    want = expected(title, run)
    assert want and _plain(found) == _plain(want)


@pytest.mark.parametrize("title", list(QUERIES))
def test_the_pyarrow_equivalent_gives_the_reference_answer(run, title):
    namespace: dict = {"run": str(run)}
    exec(setup_code(), namespace)  # the documented helper, as a user pastes it
    exec(QUERIES[title][1], namespace)
    found = namespace["result"].to_pandas()
    assert _plain(_rows(found)) == _plain(expected(title, run))


def test_memprof_answers_the_summary_the_same_way(run):
    title = next(t for t in QUERIES if t.startswith("Each rank's peak: where"))
    assert _plain(_rows(rank_summary(run))) == _plain(expected(title, run))
