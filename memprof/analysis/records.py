"""What the training process records about one iteration, before any analysis.

Torch-free on purpose: the background worker (:mod:`memprof.trace.pipeline.worker`) and the trace reader's
recovery of a killed run (:mod:`memprof.trace.pipeline.journal`) analyse these records without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from functools import cached_property
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from memprof.analysis.detail import DetailPolicy
from memprof.categories import CATEGORIES

#: Category codes used in observations and blocks (index into ``CATEGORIES``).
CAT = {c: i for i, c in enumerate(CATEGORIES)}

Storage = tuple[int, int]  # (data_ptr, nbytes)

# The hooks' rows stay plain tuples: they are appended on the training thread's hot path, where building a
# named tuple per module call would cost more than the rest of the hook. Their layouts are named here.
#: ``(time_ns, Mark, module index, storages)``: a mark, in call order (module index -1: not a module's).
MarkRow = tuple[int, int, int, Sequence[Storage]]
#: ``(time_ns, data_ptr, category code, nbytes)``: a storage seen in a role no mark implies.
ObservationRow = tuple[int, int, int, int]
#: ``(time_ns, data_ptr)``: a watched storage that existed before profiling died (CPU).
FreeRow = tuple[int, int]


class Mark(IntEnum):
    """Kinds of timeline marks recorded by the hooks."""

    FWD_ENTER = 0
    FWD_EXIT = 1
    BWD_ENTER = 2
    BWD_EXIT = 3
    BWD_END = 4
    OPT_ENTER = 5
    OPT_EXIT = 6
    #: DDP rebuilt its gradient buckets in the forward of the module (the DistributedDataParallel wrapper)
    #: whose forward began at the mark's time; its storages are the buckets that existed before profiling,
    #: freed by the rebuild, and ``(0, bytes)``: what the new buckets hold. Not a row of the timeline
    #: (:mod:`memprof.analysis.attribution`).
    BUCKETS_REBUILT = 7


@dataclass(frozen=True)
class AllocationEvents:
    """A batch of allocator events, in time order.

    Attributes:
        time_ns: event time (Unix epoch ns, the clock of ``time.time_ns()``).
        ptr: block address.
        size_bytes: bytes allocated (> 0) or freed (< 0).
        total_allocated_bytes: the allocator's running total after the event (process-relative on CPU).
        total_reserved_bytes: the allocator's reserved bytes after the event (0 on CPU).
    """

    time_ns: np.ndarray
    ptr: np.ndarray
    size_bytes: np.ndarray
    total_allocated_bytes: np.ndarray
    total_reserved_bytes: np.ndarray

    @staticmethod
    def empty() -> AllocationEvents:
        """An empty batch."""
        z = np.zeros(0, dtype=np.int64)
        return AllocationEvents(z, z, z, z, z)

    def __len__(self) -> int:
        return int(self.time_ns.shape[0])


class Drained(NamedTuple):
    """What :meth:`memprof.capture.hooks.HookRecorder.drain` hands over: one iteration's raw observations.

    The fields are those of :class:`IterationRecord` with the same names, in the same order.

    Attributes:
        marks: the hooks' marks in call order.
        observations: storages seen in a role no mark implies (weight gradients, optimizer state).
        frees: watched pre-existing storages that died.
        param_grads: parameter index -> its gradient's storage, seen when accumulated.
    """

    marks: list[MarkRow]
    observations: list[ObservationRow]
    frees: list[FreeRow]
    param_grads: dict[int, Storage]


@dataclass(frozen=True, kw_only=True, eq=False)
class MarkTemplate:
    """A hooked iteration's marks, told by position among its allocator events, for iterations that repeat it.

    While training repeats itself (the same allocations, in the same order, of the same sizes), the profiler turns
    the submodules' hooks off (:mod:`memprof.capture.steady`) and hands each such iteration the template of the
    last hooked one; the analysis (:func:`memprof.analysis.template.apply_template`) places the template's marks
    among the iteration's own events, so it is analysed as if its hooks had run. Built by
    :func:`memprof.analysis.template.take_template`; int64 arrays throughout (what the journal writes as they are).

    Attributes:
        iteration: the hooked iteration it was taken from.
        sizes: its allocator events' sizes in time order (> 0 allocated, < 0 freed).
        pairing: per event, the block it made or freed as the block's position among the iteration's
            allocations (-1: a block from before the iteration, or an address not alive).
        marks: one row per mark, in call order: kind, module, bound (the events before it), storages.
        storages: the marks' storages, in order: how the storage is found (>= 0: the block at that position;
            -1: the address itself, a storage older than the iteration; ``-2 - k``: the k-th storage of the
            model's latest forward-enter mark, its inputs), the address, the bytes.
        observations: the observations of the hooks a steady iteration goes without (the gradients', the
            optimizer's state): bound, category code, how the storage is found (as in ``storages``), address.
        param_grads: parameter index, how its gradient's storage is found, address, bytes.
    """

    iteration: int
    sizes: np.ndarray
    pairing: np.ndarray
    marks: np.ndarray
    storages: np.ndarray
    observations: np.ndarray
    param_grads: np.ndarray

    @cached_property
    def sizes_bytes(self) -> bytes:
        """:attr:`sizes` as raw int64 bytes: the training process compares each steady iteration's sizes with them
        in one ``memcmp`` (right after a training step, a numpy comparison of 1,500 sizes took 76 µs, this 27)."""
        return np.ascontiguousarray(self.sizes, dtype=np.int64).tobytes()


@dataclass(frozen=True, kw_only=True)
class IterationRecord:
    """Everything the training process saw in one iteration: the input of the analysis. Built by keyword.

    Attributes:
        iteration: its number (0-based).
        epoch: the epoch it belongs to.
        start_ns: when it began (``time.time_ns()``).
        end_ns: when ``record_stats()`` ended it.
        events: the allocator's events.
        marks: the hooks' marks, in call order (a mark's own storages are observed from the mark when it
            is analysed).
        observations: storages seen in a role no mark implies.
        frees: watched pre-existing storages that died (CPU).
        param_grads: parameter index -> storage of its gradient, seen when it was accumulated.
        grads: parameter index -> storage of its ``.grad`` at the iteration's end, for those the
            accumulate hooks did not see.
        reserved_bytes: the allocator's reserved bytes at its end (0 without a caching allocator).
        peak_reserved_bytes: the highest reserved bytes seen during it.
        failed: the iteration was cut short by an out-of-memory error or the budget guard.
        detail: the user asked to keep its detail (``record_stats(detail=True)``).
        template: the marks of the hooked iteration it repeats, when the submodules' hooks were off (its own
            ``marks`` are then the model's and the optimizer's alone).
    """

    iteration: int
    epoch: int
    start_ns: int
    end_ns: int
    events: AllocationEvents
    marks: list[MarkRow] = field(default_factory=list)
    observations: list[ObservationRow] = field(default_factory=list)
    frees: list[FreeRow] = field(default_factory=list)
    param_grads: dict[int, Storage] = field(default_factory=dict)
    grads: dict[int, Storage] = field(default_factory=dict)
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0
    failed: bool = False
    detail: bool = False
    template: MarkTemplate | None = None


# ------------------------------------------------------ what the run carries from one iteration to the next
class LiveBlock(NamedTuple):
    """A block alive across iterations (a tuple: thousands are carried from one iteration to the next)."""

    block_id: int
    ptr: int
    size_bytes: int
    category: int


class BlockTable(Sequence[LiveBlock]):
    """Live blocks as one ``(n, 4)`` int64 array (id, address, bytes, category), read as :class:`LiveBlock` rows.

    The carried state of an iteration that keeps no detail (:mod:`memprof.analysis.summary`) and of a saved
    state stays in this form: the next iteration reads its columns, and only a full sweep makes the rows.
    """

    __slots__ = ("table",)

    def __init__(self, table: np.ndarray) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.int64).reshape(-1, 4)

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [LiveBlock(*row) for row in self.table[index].tolist()]
        return LiveBlock(*self.table[index].tolist())

    def __iter__(self) -> Iterator[LiveBlock]:
        return (LiveBlock(*row) for row in self.table.tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def block_table(blocks: Sequence[LiveBlock]) -> np.ndarray:
    """``blocks`` as :attr:`BlockTable.table` (no copy where they are one)."""
    if isinstance(blocks, BlockTable):
        return blocks.table
    return np.fromiter(chain.from_iterable(blocks), dtype=np.int64, count=4 * len(blocks)).reshape(-1, 4)


@dataclass(frozen=True)
class ModuleInfo:
    """Static facts about one module of the profiled model.

    Attributes:
        name: qualified name (``""`` for the root).
        parent: index of the parent module, -1 for the root.
        depth: 0 for the root.
        kind: class name.
        param_indices: indices (into the profiler's parameter list) of the parameters in its subtree.
        buffer_bytes: bytes of the buffers in its subtree (unique storages).
    """

    name: str
    parent: int
    depth: int
    kind: str
    param_indices: tuple[int, ...]
    buffer_bytes: int


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
        detail: which iterations keep their layers and events rows.
    """

    names: tuple[str, ...]
    infos: tuple[ModuleInfo, ...]
    weight_bytes: tuple[int, ...]
    use_truth: bool
    device: str
    print_period: int
    detail: DetailPolicy = field(default_factory=DetailPolicy)

    @property
    def parents(self) -> list[int]:
        """Parent module index of each module (-1 for the root)."""
        return [info.parent for info in self.infos]

    def report_due(self, iteration: int) -> bool:
        """Whether ``iteration`` prints the console report."""
        return self.print_period > 0 and iteration % self.print_period == 0

    def answer_now(self, record: IterationRecord) -> bool:
        """Whether ``record`` must be analysed at once rather than with the next few: its report is due, or it
        failed (the post-mortem)."""
        return record.failed or self.report_due(record.iteration)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (see :meth:`from_json`)."""
        return {"names": list(self.names), "infos": [asdict(i) for i in self.infos],
                "weight_bytes": list(self.weight_bytes), "use_truth": self.use_truth, "device": self.device,
                "print_period": self.print_period, "detail": self.detail.to_json()}

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
        # a spec without a policy was written before there was one, when every iteration kept its detail
        detail = DetailPolicy.from_json(data["detail"]) if "detail" in data else DetailPolicy.everything()
        return RunSpec(names, infos, weight_bytes, bool(data["use_truth"]), str(data["device"]),
                       int(data["print_period"]), detail)


@dataclass
class CarriedState:
    """What one iteration hands to the next.

    Attributes:
        last_iteration: the iteration this state is the end of (-1: before the first).
        blocks: blocks alive at that moment, with their categories.
        next_block_id: first id to give a new block.
        order: module index -> position of its first forward call in the run.
        detailed_peak_bytes: the highest peak of the iterations that kept their detail (0: none yet).
    """

    last_iteration: int
    blocks: Sequence[LiveBlock]
    next_block_id: int
    order: dict[int, int] = field(default_factory=dict)
    detailed_peak_bytes: int = 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the carried blocks."""
        return int(block_table(self.blocks)[:, 2].sum())
