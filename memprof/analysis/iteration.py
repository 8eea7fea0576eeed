"""One iteration's analysis: from an :class:`IterationRecord` to the rows of the trace tables.

The same code runs in the training process (inline mode, and the budget guard's runs), in the
background worker (:mod:`memprof.trace.worker`) and in the reader when it finishes the journal of a killed
run, so all three produce identical rows. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from memprof.analysis.attribution import LiveBlock, sweep
from memprof.analysis.backward_replay import BackwardState, merge_marks, replay_backward
from memprof.analysis.console import format_report
from memprof.analysis.failure import failure_details
from memprof.analysis.layers import ModuleInfo, layer_rows, subtree_bytes
from memprof.analysis.records import IterationRecord, Mark
from memprof.analysis.timeline import event_table, peak_summary, series
from memprof.trace.schema import EVENTS, ITERATIONS, LAYERS
from memprof.trace.writer import TraceWriter


@dataclass(frozen=True)
class RunSpec:
    """What the analysis needs to know about the profiled model, fixed for the whole run.

    Attributes:
        names: qualified module names, root first.
        infos: static facts of each module, in the same order.
        weight_bytes: bytes of unique parameter storages in each module's subtree.
        use_truth: the allocator's running totals are absolute (CUDA) and correct the attribution.
        device: the profiled device, as a string (shown in the console report).
        print_period: console report every this many iterations (0: never).
    """

    names: tuple[str, ...]
    infos: tuple[ModuleInfo, ...]
    weight_bytes: tuple[int, ...]
    use_truth: bool
    device: str
    print_period: int

    @property
    def parents(self) -> list[int]:
        """Parent module index of each module (-1 for the root)."""
        return [info.parent for info in self.infos]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (see :meth:`from_json`)."""
        return {"names": list(self.names), "infos": [asdict(i) for i in self.infos],
                "weight_bytes": list(self.weight_bytes), "use_truth": self.use_truth, "device": self.device,
                "print_period": self.print_period}

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunSpec:
        """Rebuilds a spec written by :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError: the dict is not such a spec.
        """
        infos = tuple(ModuleInfo(name=str(i["name"]), parent=int(i["parent"]), depth=int(i["depth"]),
                                 kind=str(i["kind"]), param_indices=tuple(int(p) for p in i["param_indices"]),
                                 buffer_bytes=int(i["buffer_bytes"])) for i in data["infos"])
        names = tuple(str(n) for n in data["names"])
        weight_bytes = tuple(int(b) for b in data["weight_bytes"])
        if not len(names) == len(infos) == len(weight_bytes):
            raise ValueError(f"{len(names)} names, {len(infos)} modules and {len(weight_bytes)} weight sizes")
        return RunSpec(names, infos, weight_bytes, bool(data["use_truth"]), str(data["device"]),
                       int(data["print_period"]))


@dataclass
class CarriedState:
    """What one iteration hands to the next.

    Attributes:
        last_iteration: the iteration this state is the end of (-1: before the first).
        blocks: blocks alive at that moment, with their categories.
        next_block_id: first id to give a new block.
        order: module index -> position of its first forward call in the run.
        backward: what the replay of native backward marks carries (see
            :func:`memprof.analysis.backward_replay.replay_backward`).
    """

    last_iteration: int
    blocks: list[LiveBlock]
    next_block_id: int
    order: dict[int, int] = field(default_factory=dict)
    backward: BackwardState = field(default_factory=BackwardState)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the carried blocks."""
        return sum(b.size_bytes for b in self.blocks)


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
        found, backward = replay_backward(record.node_rows, record.watches, record.candidates, record.backward_thread,
                                          state.backward)
        sw = sweep(record.events, merge_marks(record.marks, found), record.observations,
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
            **peak_summary(sw, s, list(spec.names)),
        }
        layers = layer_rows(sw, s, list(spec.infos), record.iteration, order, list(spec.weight_bytes),
                            subtree_bytes(list(spec.infos), grads))
        table = event_table(sw, s, record.iteration, record.start_ns, record.end_ns, list(spec.names),
                            record.reserved_bytes)
        ids, sizes, categories = sw.block_ids, sw.sizes, sw.categories
        self.state = CarriedState(record.iteration,
                                  [LiveBlock(ids[i], ptr, sizes[i], categories[i]) for ptr, i in sw.live.items()],
                                  sw.next_block_id, order, backward)
        report = None
        if spec.print_period and record.iteration % spec.print_period == 0:
            report = format_report(row, layers, spec.device)
        failure = failure_details(table, layers, record.iteration) if record.failed else None
        return ProcessedIteration(record.iteration, row, layers, table, report, failure)


def root_forward_ran(record: IterationRecord) -> bool:
    """Whether the model's own forward hook fired during the iteration."""
    return any(m[1] == Mark.FWD_ENTER and m[2] == 0 for m in record.marks)


def write_processed(writer: TraceWriter, batch: list[ProcessedIteration]) -> None:
    """Writes the parts of a batch of iterations; the iterations rows last.

    A reader keeps only iterations that have their row, so a kill between parts never leaves an
    iteration half-written.

    Raises:
        OSError: a part could not be written (the parts written before it stay valid).
    """
    if not batch:
        return
    writer.append(LAYERS, [row for item in batch for row in item.layers])
    writer.append(EVENTS, pa.concat_tables([item.events for item in batch]))
    writer.append(ITERATIONS, [item.row for item in batch])
