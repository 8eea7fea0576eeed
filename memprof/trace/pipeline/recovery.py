"""Finishing a run's journal in memory: the iterations its worker had not written yet.

A run whose training process and worker were both killed (or that is still running) has records
in ``<run>/.journal/`` past the last written Parquet part. :func:`recover` analyses them with the
same code the worker runs, so :func:`memprof.load_trace` shows every iteration that ``record_stats()``
completed. Nothing is written: reading a trace never changes it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa

from memprof.analysis.iteration import IterationProcessor, ProcessedIteration, flatten
from memprof.errors import CorruptTraceError
from memprof.schema import ALLOCATIONS, EVENTS, ITERATIONS, LAYERS
from memprof.trace.format.writer import rows_to_table
from memprof.trace.pipeline.journal import JOURNAL_DIR, JournalReader, read_spec, read_state

_ATTEMPTS = 5  # a live worker may delete a segment between our reads: start again


def recover(run_dir: Path) -> list[ProcessedIteration]:
    """Analyses the journaled iterations of ``run_dir`` that its worker had not written.

    A damaged journal is reported with a warning and skipped: the written tables stay readable.
    """
    journal_dir = Path(run_dir) / JOURNAL_DIR
    if not journal_dir.is_dir():
        return []
    for _ in range(_ATTEMPTS):
        try:
            state = read_state(journal_dir)
            processor = IterationProcessor(read_spec(journal_dir), state)
            reader = JournalReader(journal_dir, state.last_iteration)
            out = []
            while (record := reader.next()) is not None:
                out.append(processor.process(record))
            return out
        except FileNotFoundError:
            if not journal_dir.is_dir():  # the worker finished and removed it
                return []
        except (CorruptTraceError, OSError) as exc:
            warnings.warn(f"memprof could not finish the journal of {run_dir} ({exc}); showing the iterations "
                          "written to its tables only", RuntimeWarning, stacklevel=3)
            return []
    return []


def recovered_frame(items: list[ProcessedIteration], table: str) -> pd.DataFrame | None:
    """The rows of ``table`` among the recovered iterations (``None`` when there are none)."""
    if not items:
        return None
    items = flatten(items)
    if table == ITERATIONS:
        return rows_to_table(ITERATIONS, [item.row for item in items]).to_pandas()
    if table == LAYERS:
        return rows_to_table(LAYERS, [row for item in items for row in item.layers]).to_pandas()
    if table == EVENTS:
        return pa.concat_tables([item.events for item in items]).to_pandas()
    if table == ALLOCATIONS:
        found = [item.allocations for item in items if item.allocations is not None]
        return pa.concat_tables(found).to_pandas() if found else None
    raise KeyError(table)
