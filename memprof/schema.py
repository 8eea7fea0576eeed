"""The trace contract: file names, the schema version and the columns of every table.

A run is a directory ``<out_dir>/<run_id>/`` (``<out_dir>/<run_id>/rank=<r>/`` under
``torch.distributed``) holding ``meta.json`` and three tables: ``iterations`` (one summary row per
iteration), ``layers`` and ``events`` (the detail, kept for the iterations the detail policy chose), and,
when a planning pass ran, the optional ``ops`` table (the aten ops of one iteration's forward).
Each table is a directory of Parquet parts (``iterations.parquet/part-000001.parquet`` ...), each
written to a hidden temporary name and renamed into place, so a killed run leaves every flushed iteration
readable and ``pandas.read_parquet(run_dir / "events.parquet")`` reads a table as one frame. Each flush
appends a part, and :mod:`memprof.trace.format.compaction` merges them into fewer, bigger parts as the run goes
(``part-<last>.t<tier>-<first>.parquet``), so a table has a bounded number of parts. ``docs/trace-format.md``
documents the layout and every column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from memprof.categories import CATEGORY_COLUMNS

#: Bumped whenever a column changes meaning or a required column is added or removed.
SCHEMA_VERSION = 2
#: Versions this reader opens. Version 1 traces (before the detail policy) have detail for every iteration.
READABLE_VERSIONS: tuple[int, ...] = (1, 2)
#: Marker in ``meta.json`` that tells a memprof trace from another tool's JSON.
FORMAT_NAME = "memprof-trace"

META_FILE = "meta.json"
ITERATIONS = "iterations"
LAYERS = "layers"
EVENTS = "events"
TABLES: tuple[str, ...] = (ITERATIONS, LAYERS, EVENTS)
#: Written only by a planning pass (``MemoryProfiler(..., ops=True)``, ``memprof profile-ops``): the aten ops
#: of one iteration's forward. Optional: a trace without it (every trace before it existed) has no op rows.
OPS = "ops"
#: Written for detailed iterations since the drill-down existed (optional: older traces have none): one row per
#: allocation alive at some events row (``allocations``), and the op and Python stack of allocations the
#: training process saw made (``stacks``, written by that process itself, like ``ops``).
ALLOCATIONS = "allocations"
STACKS = "stacks"
OPTIONAL_TABLES: tuple[str, ...] = (OPS, ALLOCATIONS, STACKS)

#: Keys every ``meta.json`` must have.
META_KEYS: tuple[str, ...] = (
    "format",
    "schema_version",
    "run_id",
    "created_at",
    "device",
    "torch_version",
    "model",
    "rank",
    "world_size",
)


def costing_iterations(meta: Mapping[str, Any]) -> list[int]:
    """A compiled model's costing iterations (``[]`` for an eager model's run), from its ``meta.json``.

    Those it ran compiled block by block (``regional_iterations``) when there are any, else those it ran eagerly
    (``eager_iterations``): they give the layers and the planner's chain. They ran as the user's compiled model
    does not, so they never headline the run; an old trace's eager ones are left out of the headline too.
    """
    return sorted(int(i) for i in (meta.get("regional_iterations") or meta.get("eager_iterations") or ()))


def not_headlining(meta: Mapping[str, Any]) -> set[int]:
    """The iterations a run's headline peak is never chosen from: every costing iteration, eager or regional."""
    return {int(i) for key in ("regional_iterations", "eager_iterations") for i in (meta.get(key) or ())}


def _category_fields() -> list[pa.Field]:
    return [pa.field(name, pa.int64()) for name in CATEGORY_COLUMNS]


ITERATIONS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("epoch", pa.int64()),
        pa.field("step_ms", pa.float64()),
        pa.field("peak_allocated_bytes", pa.int64()),
        pa.field("peak_reserved_bytes", pa.int64()),
        pa.field("allocated_bytes", pa.int64()),
        pa.field("reserved_bytes", pa.int64()),
        pa.field("peak_phase", pa.string()),
        pa.field("peak_module", pa.string()),
        pa.field("num_events", pa.int64()),
        pa.field("num_allocations", pa.int64()),
        pa.field("detail", pa.bool_()),
        pa.field("micro_batches", pa.int64()),  # parts written before it existed read as 1 (LATER_COLUMNS)
        # -1: its own hooks attributed it; n >= 0: a steady iteration, attributed by iteration n's marks (which it
        # repeats); -2: a steady iteration that did not repeat them (memprof.analysis.template)
        pa.field("template_iteration", pa.int64()),
        *_category_fields(),
    ]
)
#: Columns a version 1 trace lacks, with the value they take when it is read.
V1_DEFAULTS: dict[str, dict[str, object]] = {"iterations": {"detail": True}}
#: Categories added after the first traces were written: parts written before them read as 0 bytes (no memory
#: was told apart as such then; it was in ``feature_maps`` and ``other``).
LATER_CATEGORIES: dict[str, object] = {"weight_copies": 0, "comm_buffers": 0}
#: Columns added to a table after its first parts were written (no schema version change: older parts lack
#: them and read with these values; an older reader sees more columns and misreads none of those it knows,
#: though its categories then sum to less than the total where a run had weight copies or comm buffers).
LATER_COLUMNS: dict[str, dict[str, object]] = {
    "ops": {"writes": None, "reads": None},
    "iterations": {"micro_batches": 1, "template_iteration": -1, **LATER_CATEGORIES},
    "events": dict(LATER_CATEGORIES),
    "layers": {"weight_copy_bytes": 0, "comm_buffer_bytes": 0},
}

LAYERS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("module", pa.string()),
        pa.field("parent", pa.string()),
        pa.field("depth", pa.int64()),
        pa.field("order", pa.int64()),
        pa.field("kind", pa.string()),
        pa.field("calls", pa.int64()),
        pa.field("weight_bytes", pa.int64()),
        pa.field("weight_grad_bytes", pa.int64()),
        pa.field("buffer_bytes", pa.int64()),
        pa.field("feature_map_bytes", pa.int64()),
        pa.field("weight_copy_bytes", pa.int64()),  # parts written before it existed read as 0 (LATER_COLUMNS)
        pa.field("comm_buffer_bytes", pa.int64()),  # likewise
        pa.field("input_bytes", pa.int64()),
        pa.field("output_bytes", pa.int64()),
        pa.field("saved_bytes", pa.int64()),
        pa.field("grad_input_bytes", pa.int64()),
        pa.field("forward_ms", pa.float64()),
        pa.field("backward_ms", pa.float64()),
        pa.field("forward_overhead_bytes", pa.int64()),
        pa.field("backward_overhead_bytes", pa.int64()),
        pa.field("input_ids", pa.list_(pa.int64())),
        pa.field("output_ids", pa.list_(pa.int64())),
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("time_ns", pa.int64()),
        pa.field("phase", pa.string()),
        pa.field("module", pa.string()),
        pa.field("event", pa.string()),
        pa.field("allocated_bytes", pa.int64()),
        pa.field("peak_bytes", pa.int64()),
        pa.field("peak_activation_bytes", pa.int64()),
        pa.field("reserved_bytes", pa.int64()),
        *_category_fields(),
    ]
)

#: One row per recorded op (:class:`memprof.analysis.op_records.OpRecord`) and the iteration it ran in.
OPS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("index", pa.int64()),
        pa.field("module", pa.string()),
        pa.field("op", pa.string()),
        pa.field("output_bytes", pa.int64()),
        pa.field("needs", pa.list_(pa.int64())),
        pa.field("forward_ms", pa.float64()),
        pa.field("flops", pa.int64()),
        pa.field("writes", pa.list_(pa.int64())),  # null in parts written before the column existed
        pa.field("reads", pa.list_(pa.int64())),  # likewise
    ]
)

#: One row per allocation of a detailed iteration that is alive at one events row or more
#: (:mod:`memprof.analysis.allocations`): alive at the events rows ``first_seq`` .. ``last_seq`` of its iteration.
ALLOCATIONS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("block", pa.int64()),  # the block's id, unique within the run
        pa.field("bytes", pa.int64()),
        pa.field("category", pa.string()),
        pa.field("module", pa.string()),  # the module running when it was allocated ("" for none)
        pa.field("phase", pa.string()),  # forward, backward, optimizer, other; "before": alive when the iteration began
        pa.field("first_seq", pa.int64()),
        pa.field("last_seq", pa.int64()),
        pa.field("ptr", pa.int64()),  # its address and allocation time (0 when alive before the iteration)
        pa.field("alloc_ns", pa.int64()),
    ]
)

#: One row per op output storage the training process saw allocated in a detailed iteration
#: (:mod:`memprof.capture.stacks`); ``stack`` only for outputs of at least the capture threshold ("" otherwise).
STACKS_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64()),
        pa.field("time_ns", pa.int64()),  # when the op returned (the clock of the allocation events)
        pa.field("ptr", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("op", pa.string()),  # e.g. aten.mm.default
        pa.field("stack", pa.string()),  # innermost frame last, one "file:line in function" per line
    ]
)

#: The tables every flush of the profiler writes (and the writer compacts); ``allocations`` is optional to readers.
SCHEMAS: dict[str, pa.Schema] = {
    ITERATIONS: ITERATIONS_SCHEMA,
    LAYERS: LAYERS_SCHEMA,
    EVENTS: EVENTS_SCHEMA,
    ALLOCATIONS: ALLOCATIONS_SCHEMA,
}
#: Every table the reader opens: the flushed ones and the optional ones.
READ_SCHEMAS: dict[str, pa.Schema] = {**SCHEMAS, OPS: OPS_SCHEMA, STACKS: STACKS_SCHEMA}


def table_dir_name(table: str) -> str:
    """Returns the on-disk directory name of a table (``"events"`` -> ``"events.parquet"``)."""
    return f"{table}.parquet"
