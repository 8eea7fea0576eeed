"""One iteration's analysis: from an :class:`IterationRecord` to the rows of the trace tables.

The same code runs in the training process (inline mode, and the budget guard's runs), in the
background worker (:mod:`memprof.trace.pipeline.worker`) and in the reader when it finishes the journal of a killed
run, so all three produce identical rows. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import pyarrow as pa

from memprof.analysis.allocations import allocation_table
from memprof.analysis.attribution import Sweep
from memprof.analysis.console import format_report
from memprof.analysis.failure import failure_details
from memprof.analysis.layers import layer_rows, subtree_bytes
from memprof.analysis.marks_walk import MarksCache
from memprof.analysis.micro_batches import micro_batches
from memprof.analysis.records import CarriedState, IterationRecord, LiveBlock, Mark, RunSpec
from memprof.analysis.summary import summary_sweep
from memprof.analysis.summary_memo import SummaryMemo
from memprof.analysis.sweep import sweep
from memprof.analysis.template import Placed, apply_template
from memprof.analysis.template_summary import template_summary
from memprof.analysis.timeline import (
    Series,
    event_table,
    peak_fields,
    peak_figures,
    peak_notes,
    peak_row,
    series,
)
from memprof.schema import EVENTS_SCHEMA

#: ``template_iteration`` of an iteration its own hooks attributed.
OWN_HOOKS = -1
#: ``template_iteration`` of a steady iteration that did not repeat its template: attributed by the hooks that
#: stay on alone (the model's, the optimizer's marks), so submodules' outputs and weight gradients read as ``other``.
NOT_REPEATED = -2


@dataclass(frozen=True)
class ProcessedIteration:
    """The trace rows of one iteration, and what the training process is told about it.

    Attributes:
        iteration: its number.
        row: its row of the iterations table.
        layers: its rows of the layers table (empty when it keeps no detail).
        events: its rows of the events table (empty when it keeps no detail).
        report: the console report, on iterations where one is due.
        failure: the post-mortem details, when the iteration failed.
        detail: whether it keeps its layers and events rows.
        before: the iteration before a failed one, analysed again with its detail, when it had kept none.
    """

    iteration: int
    row: dict[str, Any]
    layers: list[dict[str, Any]]
    events: pa.Table
    report: str | None = None
    failure: dict[str, Any] | None = None
    detail: bool = True
    before: ProcessedIteration | None = None
    #: its rows of the allocations table (memprof.analysis.allocations), when it keeps its detail
    allocations: pa.Table | None = None

    @property
    def not_repeated(self) -> bool:
        """It ran without the submodules' hooks and did not repeat its template (``template_iteration`` -2)."""
        return self.row.get("template_iteration") == NOT_REPEATED

    @property
    def detailed(self) -> tuple[int, ...]:
        """The iterations whose detail this item carries (itself, and the one before a failure)."""
        own = (self.iteration,) if self.detail else ()
        return (self.before.iteration, *own) if self.before is not None else own


def flatten(batch: Sequence[ProcessedIteration]) -> list[ProcessedIteration]:
    """The items of a batch in order, each ``before`` in front of its item, one item per iteration (the last).

    An iteration analysed again with its detail replaces its first analysis when both are in one batch; when
    they are in different parts, the reader's rule (the last part that holds an iteration wins) does the same.
    """
    ordered = [x for item in batch for x in ((item.before, item) if item.before is not None else (item,))]
    last = {item.iteration: index for index, item in enumerate(ordered)}
    return [item for index, item in enumerate(ordered) if last[item.iteration] == index]


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
        self._empty_events = EVENTS_SCHEMA.empty_table()
        self._marks = MarksCache(self._parents)
        self._summaries = SummaryMemo()  # consecutive steady iterations' attribution, reused where it repeats
        # The last iteration when it kept no detail, with the state before it: should the next one fail,
        # it is analysed again with its detail (the step before an out-of-memory error is the one to see).
        self._previous: tuple[CarriedState, IterationRecord] | None = None

    def process(self, record: IterationRecord) -> ProcessedIteration:
        """Analyses ``record`` and advances the carried state past it."""
        state = self.state
        processed, self.state = self._analyse(state, record, forced=False)
        previous = self._previous
        self._previous = None if processed.detail else (state, record)
        if record.failed and previous is not None and previous[1].iteration == record.iteration - 1:
            before, _ = self._analyse(*previous, forced=True, report=False)
            return replace(processed, before=before)
        return processed

    def _peak(self, sw: Sweep, state: CarriedState, detail: bool,
              report_due: bool) -> tuple[Series | None, int, bool, dict[str, Any]]:
        """The series (when the detail or the report needs it), the peak, whether the iteration keeps its detail
        (``detail``, or a new peak), and the peak's summary.

        The per-category series costs the background worker more than the rest of an iteration that keeps no
        detail, which only reads it at its peak: those take the totals and the categories at the peak alone.
        """
        spec = self.spec
        s = series(sw, use_truth=spec.use_truth) if detail or report_due or spec.use_truth else None
        if s is not None:
            total, at_peak = s.total, s.per_category[int(np.argmax(s.total))]
        else:
            total, at_peak = peak_figures(sw)
        peak = int(total.max())
        if not detail and spec.detail.new_peak(peak, state.detailed_peak_bytes):
            detail = True
            s = s if s is not None else series(sw, use_truth=spec.use_truth)
        return s, peak, detail, peak_row(sw, total, at_peak, list(spec.names))

    def _analyse(self, state: CarriedState, record: IterationRecord, forced: bool,
                 report: bool = True) -> tuple[ProcessedIteration, CarriedState]:
        """One iteration's rows from the state before it (a pure function of both), and the state after it."""
        spec = self.spec
        report_due = report and spec.report_due(record.iteration)
        detail = forced or record.detail or record.failed or spec.detail.scheduled(record.iteration)
        if not (detail or report_due or spec.use_truth):
            summarised = self._summarised(state, record)
            if summarised is not None:
                return summarised
        hooks, source = _hooks(record)
        sw = sweep(record.events, hooks.marks, hooks.observations,
                   [] if spec.use_truth else record.frees, state.blocks, self._parents, state.next_block_id,
                   use_truth=spec.use_truth)
        order = dict(state.order)
        for call in sorted(sw.forward_calls, key=lambda c: c.start_ns):
            order.setdefault(call.module, len(order))
        split = micro_batches(sw.marks)  # gradient accumulation: the layers rows are one micro-batch's
        s, peak, detail, summary = self._peak(sw, state, detail, report_due)
        row = _row(record, len(sw.marks), len(sw.alloc_change) - sw.alloc_change.count(-1), detail, split.count,
                   source, summary)  # (allocations: ids >= 0; -1: alive before the iteration)
        layers: list[dict[str, Any]] = []
        if s is not None and (detail or report_due):  # the console report shows the layers
            grads = {**record.grads, **hooks.param_grads}
            layers = layer_rows(sw, s, list(spec.infos), record.iteration, order, list(spec.weight_bytes),
                                subtree_bytes(list(spec.infos), grads), split,
                                comm_bytes=cast(int, summary["comm_buffers"]))
        table, allocations = self._empty_events, None
        if s is not None and detail:
            table = event_table(sw, s, record.iteration, record.start_ns, record.end_ns, list(spec.names),
                                record.reserved_bytes)
            allocations = allocation_table(sw, record.events, record.iteration, spec.names)
        ids, sizes, categories = sw.block_ids, sw.sizes, sw.categories
        after = CarriedState(record.iteration,
                             [LiveBlock(ids[i], ptr, sizes[i], categories[i]) for ptr, i in sw.live.items()],
                             sw.next_block_id, order,
                             max(state.detailed_peak_bytes, peak) if detail else state.detailed_peak_bytes)
        text = None
        if report_due and s is not None:  # (the report's series is always built)
            text = format_report({**row, **peak_notes(sw, s.total)}, layers, spec.device)
        failure = failure_details(table, layers, record.iteration) if record.failed else None
        return ProcessedIteration(record.iteration, row, layers if detail else [], table, text, failure,
                                  detail, allocations=allocations), after

    def _summarised(self, state: CarriedState, record: IterationRecord) -> tuple[ProcessedIteration, CarriedState] | None:
        """An iteration that keeps no detail, from its summary (:mod:`memprof.analysis.summary`; a steady one's from
        its template, :mod:`memprof.analysis.template_summary`); ``None`` where the sweep must run (the summary
        declines, the iteration does not repeat its template, or a new peak makes it keep its detail)."""
        spec, template = self.spec, record.template
        args = (state.blocks, state.next_block_id, state.order, self._marks)
        if template is None:
            found = summary_sweep(record.events, record.marks, record.observations, record.frees, *args)
            marks, source = len(record.marks), OWN_HOOKS
        else:
            found = template_summary(record, *args, memo=self._summaries)
            marks, source = len(template.marks), template.iteration
        if found is None or spec.detail.new_peak(int(found.total.max()), state.detailed_peak_bytes):
            return None
        peak = peak_fields(found.total, found.at_peak, found.peak_phase, found.peak_module, list(spec.names))
        row = _row(record, marks, found.num_allocations, False, found.micro_batches, source, peak)
        after = CarriedState(record.iteration, found.live, found.next_block_id, state.order, state.detailed_peak_bytes)
        return ProcessedIteration(record.iteration, row, [], self._empty_events, detail=False), after


def _row(record: IterationRecord, marks: int, allocations: int, detail: bool, micro: int, source: int,
         peak: dict[str, Any]) -> dict[str, Any]:
    """The iteration's row of the iterations table."""
    return {
        "iteration": record.iteration,
        "epoch": record.epoch,
        "step_ms": (record.end_ns - record.start_ns) / 1e6,
        "peak_reserved_bytes": record.peak_reserved_bytes,
        "reserved_bytes": record.reserved_bytes,
        "num_events": marks + 2,
        "num_allocations": allocations,
        "detail": detail,
        "micro_batches": micro,
        "template_iteration": source,
        **peak,
    }


def _hooks(record: IterationRecord) -> tuple[Placed, int]:
    """The hooks' records to analyse a record with, and whose they are (the ``template_iteration`` column)."""
    own = Placed(record.marks, record.observations, record.param_grads)
    if record.template is None:
        return own, OWN_HOOKS
    placed = apply_template(record.template, record)
    return (own, NOT_REPEATED) if placed is None else (placed, record.template.iteration)


def root_forward_ran(record: IterationRecord) -> bool:
    """Whether the model's own forward hook fired during the iteration."""
    return any(m[1] == Mark.FWD_ENTER and m[2] == 0 for m in record.marks)
