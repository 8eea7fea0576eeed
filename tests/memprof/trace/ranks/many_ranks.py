"""Synthetic distributed runs with many ranks, and the slow, obviously correct reference answers.

:func:`write_many_ranks` writes ``<run>/rank=<r>/`` for every rank with memprof's writer: an
``iterations`` table of many rows in parts (optionally merged parts of several row groups, as a
compaction writes them, and a part written again as after a crash) and ``layers`` rows for a few
detailed iterations. The ``reference_*`` functions load every rank whole with :func:`load_run` and
pandas; the streaming reader and the documented DuckDB queries are tested against them.
:func:`documented_queries` reads those queries from docs/trace-format.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.categories import CATEGORY_COLUMNS
from memprof.schema import ITERATIONS, ITERATIONS_SCHEMA, LAYERS, LAYERS_SCHEMA, table_dir_name
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.trace.ranks import rank_dirs
from memprof.trace.reader import load_run
from tests.dashboard.fixtures import meta

MODULES: tuple[str, ...] = ("", "encoder", "encoder.block.0", "encoder.block.1", "encoder.block.2", "head", "loss")
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "other")
MIB = 1 << 20
#: The document whose "Many ranks" section shows the DuckDB and pyarrow queries.
DOC = Path(__file__).resolve().parents[4] / "docs" / "trace-format.md"


def iteration_table(rank: int, first: int, count: int, ranks: int = 1) -> pa.Table:
    """``count`` iterations rows of ``rank`` from iteration ``first``; values depend on rank and iteration only.

    Peaks saw-tooth with the iteration and grow with the rank; every rank repeats its highest value
    (ties: the first iteration wins) and rank ``ranks // 2`` has one spike far above the others.
    """
    iteration = np.arange(first, first + count, dtype=np.int64)
    peak = (100 + rank) * MIB + (iteration * 7919 % 1000) * 1024
    if ranks > 1 and rank == ranks // 2:
        peak = np.where(iteration == first + 2 * count // 3, 400 * MIB, peak)
    reserved = (peak // (2 * MIB) + 1) * 2 * MIB + (iteration % 5) * MIB
    columns: dict[str, object] = {
        "iteration": iteration, "epoch": iteration // 1000, "step_ms": 10.0 + (iteration % 3),
        "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved, "allocated_bytes": peak // 2,
        "reserved_bytes": reserved, "peak_phase": np.array(PHASES, dtype=object)[iteration % len(PHASES)],
        "peak_module": np.array(MODULES, dtype=object)[(iteration + rank) % len(MODULES)],
        "num_events": np.full(count, 50, np.int64), "num_allocations": np.full(count, 40, np.int64),
        "detail": iteration % 997 == 0, "micro_batches": np.ones(count, np.int64),
        "template_iteration": np.full(count, -1, np.int64)}
    share = peak // len(CATEGORY_COLUMNS)
    for index, name in enumerate(CATEGORY_COLUMNS):
        columns[name] = share if index else peak - share * (len(CATEGORY_COLUMNS) - 1)
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in ITERATIONS_SCHEMA},
                    schema=ITERATIONS_SCHEMA)


def layers_table(rank: int, iterations: Sequence[int]) -> pa.Table:
    """``layers`` rows of the given iterations: every module of :data:`MODULES`, saved bytes by rank and module."""
    rows = []
    for iteration in iterations:
        for order, module in enumerate(MODULES):
            saved = (order + 1) * (rank + 1) * 1024 + iteration % 7
            rows.append({"iteration": iteration, "module": module, "parent": module.rpartition(".")[0],
                         "depth": module.count(".") + (1 if module else 0), "order": order, "kind": "Block",
                         "calls": 1, "weight_bytes": 4096, "weight_grad_bytes": 4096, "buffer_bytes": 0,
                         "feature_map_bytes": saved, "input_bytes": 1024, "output_bytes": 1024,
                         "saved_bytes": saved, "grad_input_bytes": 1024, "forward_ms": 0.1, "backward_ms": 0.2,
                         "forward_overhead_bytes": 0, "backward_overhead_bytes": 0, "input_ids": [order],
                         "output_ids": [order + 1]})
    return pa.Table.from_pylist(rows, schema=LAYERS_SCHEMA)


def write_many_ranks(root: Path, ranks: int, iterations: int, part_rows: int = 16_384,
                     row_group_rows: int | None = None, rewritten: int = 0,
                     detailed: Sequence[int] = ()) -> Path:
    """Writes a distributed run of ``ranks`` ranks of ``iterations`` iterations each; returns its folder.

    Args:
        root: the run's folder (``root/rank=<r>/`` are written).
        ranks, iterations: the run's size.
        part_rows: rows per ``iterations`` part.
        row_group_rows: when given, parts are written as a compaction merges them: several row
            groups of this many rows each.
        rewritten: the last this many iterations of every rank are written again in one more part,
            as the profiler does after its worker died (the reader keeps the last part's copy).
        detailed: iterations with ``layers`` rows (the detailed ones).
    """
    for rank in range(ranks):
        run_dir = root / f"rank={rank}"
        writer = TraceWriter(run_dir)
        table = iteration_table(rank, 0, iterations, ranks)
        for start in range(0, iterations, part_rows):
            part = table.slice(start, part_rows)
            if row_group_rows is None:
                writer.append(ITERATIONS, part)
            else:
                directory = run_dir / table_dir_name(ITERATIONS)
                directory.mkdir(parents=True, exist_ok=True)
                name = f"part-{start // part_rows + 1:06d}.parquet"
                pq.write_table(part, directory / name, row_group_size=row_group_rows, write_statistics=["iteration"])
        if rewritten:
            TraceWriter(run_dir).append(ITERATIONS, table.slice(iterations - rewritten))
        if detailed:
            TraceWriter(run_dir).append(LAYERS, layers_table(rank, detailed))
        write_meta(run_dir, meta("many", rank=rank, world_size=ranks))
    return root


def reference_frame(run: Path, table: str = ITERATIONS) -> pd.DataFrame:
    """Every rank's ``table`` loaded whole by :func:`load_run` (duplicates resolved), with a ``rank`` column."""
    frames = [load_run(directory).read(table).assign(rank=rank) for rank, directory in rank_dirs(run)]
    return pd.concat(frames, ignore_index=True).sort_values(["rank", "iteration"], kind="stable",
                                                            ignore_index=True)


def reference_summary(run: Path) -> pd.DataFrame:
    """Per rank: highest peak, its first iteration, module and phase there, iteration count, highest reserved."""
    frame = reference_frame(run)
    rows = []
    for rank, own in frame.groupby("rank", sort=True):
        top = own[own.peak_allocated_bytes == own.peak_allocated_bytes.max()].sort_values("iteration").iloc[0]
        rows.append({"rank": int(rank), "peak_allocated_bytes": int(top.peak_allocated_bytes),
                     "peak_iteration": int(top.iteration), "peak_module": top.peak_module,
                     "peak_phase": top.peak_phase, "iterations": own.iteration.nunique(),
                     "peak_reserved_bytes": int(own.peak_reserved_bytes.max())})
    return pd.DataFrame(rows)


def reference_peaks(run: Path, max_points: int | None) -> pd.DataFrame:
    """Per rank: its span of iterations cut into equal buckets; each bucket's highest peak (first iteration
    on ties) and highest reserved bytes."""
    frames = []
    for rank, own in reference_frame(run).groupby("rank", sort=True):
        first, last = int(own.iteration.min()), int(own.iteration.max())
        width = -(-(last - first + 1) // max_points) if max_points else 1
        own = own.assign(bucket=(own.iteration - first) // width)
        best = own.sort_values(["bucket", "peak_allocated_bytes", "iteration"], ascending=[True, False, True])
        best = best.groupby("bucket").head(1).set_index("bucket")
        frames.append(pd.DataFrame({"rank": int(rank), "iteration": best.iteration,
                                    "peak_allocated_bytes": best.peak_allocated_bytes,
                                    "peak_reserved_bytes": own.groupby("bucket").peak_reserved_bytes.max()}))
    return pd.concat(frames, ignore_index=True)


def _section() -> str:
    """The "Many ranks" section of :data:`DOC`."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Many ranks\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(sql|python)\n(.*?)```", text, flags=re.S)


def documented_queries() -> dict[str, tuple[str, str]]:
    """``{question: (duckdb sql, pyarrow code)}`` in document order."""
    queries = {}
    for part in _section().split("\n### ")[1:]:
        title = part.splitlines()[0].strip()
        blocks = dict(_blocks(part))
        queries[title] = (blocks["sql"], blocks["python"])
    return queries


def setup_code() -> str:
    """The pyarrow helper that the pyarrow blocks start from."""
    return _blocks(_section().split("\n### ")[0])[0][1]
