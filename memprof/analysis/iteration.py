"""One iteration's analysis: from an :class:`IterationRecord` to the rows of the trace tables.

The same code runs in the training process (inline mode, and the budget guard's runs), in the
background worker (:mod:`memprof.trace.worker`) and in the reader when it finishes the journal of a killed
run, so all three produce identical rows. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from memprof.analysis.attribution import sweep
from memprof.analysis.console import format_report
from memprof.analysis.failure import failure_details
from memprof.analysis.layers import layer_rows, subtree_bytes
from memprof.analysis.records import CarriedState, IterationRecord, LiveBlock, Mark, RunSpec
from memprof.analysis.timeline import event_table, peak_summary, series


@dataclass(frozen=True)
class ProcessedIteration:
    """The trace rows of one iteration, and what the training process is told about it.

    Attributes:
        iteration: its number.
        row: its row of the iterations table.
        layers: its rows of the layers table.
        events: its rows of the events table.
        report: the console report, on iterations where one is due.
        failure: the post-mortem details, when the iteration failed.
    """

    iteration: int
    row: dict[str, Any]
    layers: list[dict[str, Any]]
    events: pa.Table
    report: str | None = None
    failure: dict[str, Any] | None = None


class IterationProcessor:
    """Analyses the records of one run in order, carrying live blocks from one to the next.

    Args:
        spec: the run's static facts.
        state: the state after the last processed iteration.
    """

    def __init__(self, spec: RunSpec, state: CarriedState) -> None:
        self.spec = spec
        self.state = state
        self._parents = spec.parents

    def process(self, record: IterationRecord) -> ProcessedIteration:
        """Analyses ``record`` and advances the carried state past it."""
        spec, state = self.spec, self.state
        sw = sweep(record.events, record.marks, record.observations,
                   [] if spec.use_truth else record.frees, state.blocks, self._parents, state.next_block_id,
                   use_truth=spec.use_truth)
        s = series(sw, use_truth=spec.use_truth)
        order = dict(state.order)
        for call in sorted(sw.forward_calls, key=lambda c: c.start_ns):
            order.setdefault(call.module, len(order))
        grads = {**record.grads, **record.param_grads}
        row = {
            "iteration": record.iteration,
            "epoch": record.epoch,
            "step_ms": (record.end_ns - record.start_ns) / 1e6,
            "peak_reserved_bytes": record.peak_reserved_bytes,
            "reserved_bytes": record.reserved_bytes,
            "num_events": len(sw.marks) + 2,
            "num_allocations": int(sum(1 for a in sw.alloc_change if a >= 0)),
            "detail": True,
            **peak_summary(sw, s, list(spec.names)),
        }
        layers = layer_rows(sw, s, list(spec.infos), record.iteration, order, list(spec.weight_bytes),
                            subtree_bytes(list(spec.infos), grads))
        table = event_table(sw, s, record.iteration, record.start_ns, record.end_ns, list(spec.names),
                            record.reserved_bytes)
        ids, sizes, categories = sw.block_ids, sw.sizes, sw.categories
        self.state = CarriedState(record.iteration,
                                  [LiveBlock(ids[i], ptr, sizes[i], categories[i]) for ptr, i in sw.live.items()],
                                  sw.next_block_id, order)
        report = None
        if spec.print_period and record.iteration % spec.print_period == 0:
            report = format_report(row, layers, spec.device)
        failure = failure_details(table, layers, record.iteration) if record.failed else None
        return ProcessedIteration(record.iteration, row, layers, table, report, failure)


def root_forward_ran(record: IterationRecord) -> bool:
    """Whether the model's own forward hook fired during the iteration."""
    return any(m[1] == Mark.FWD_ENTER and m[2] == 0 for m in record.marks)
