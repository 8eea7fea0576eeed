"""The op-level records of a planning pass: one row per aten op of one training step's forward.

A planning pass (``MemoryProfiler(..., ops=True)`` or ``memprof profile-ops``) records, inside each module,
the aten ops one forward runs, what they allocate, what autograd keeps of them for backward, and what they
cost. The planner derives each block's recomputation options from these rows
(:mod:`planner.discovery.option_builder`). Torch-free: the trace's ``ops`` table reads back into these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class OpRecord:
    """One aten op of the recorded forward.

    Attributes:
        index: position in the recorded forward (0-based, the order ops were dispatched).
        module: qualified name of the innermost module whose forward ran the op (``""`` outside any).
        op: the aten overload, e.g. ``"aten.addmm.default"``.
        output_bytes: bytes of the storages the op's outputs newly allocated (0 for views and in-place ops).
        needs: indexes of the ops whose outputs this op's backward reads (what its autograd node saved),
            its own index included when it saves its output (``relu``, ``tanh``); tensors made outside the
            recorded forward (inputs, parameters) are not listed.
        forward_ms: wall time of the op in the recorded forward.
        flops: its FLOPs by ``torch.utils.flop_counter``'s formulas (0 for ops it does not count).
        writes: indexes of the ops whose outputs this op wrote in place (``relu_`` on a convolution's output,
            ``bernoulli_`` filling an ``empty_like``); ``None`` when not recorded (traces written before the
            column existed).
        reads: indexes of the ops whose outputs this op takes as tensor inputs, by storage like ``writes`` (a
            view's reader names the op that allocated its storage; an in-place op reads what it writes);
            tensors made outside the recorded forward (inputs, parameters) are not listed. The planner walks
            them back to price a partial recomputation (:mod:`planner.discovery.cone`); ``None`` when not
            recorded (traces written before the column existed).
    """

    index: int
    module: str
    op: str
    output_bytes: int
    needs: tuple[int, ...] = ()
    forward_ms: float = 0.0
    flops: int = 0
    writes: tuple[int, ...] | None = None
    reads: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for key in ("index", "output_bytes", "flops"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"op record {self.op or '?'}: {key} must be a whole number >= 0, found {value!r}")
        if not math.isfinite(self.forward_ms) or self.forward_ms < 0:
            raise ValueError(f"op record {self.op}: forward_ms must be a finite number >= 0, found {self.forward_ms!r}")
        needs = tuple(int(i) for i in self.needs)
        if any(not 0 <= i <= self.index for i in needs):
            raise ValueError(f"op record {self.index} ({self.op}): needs must name this op or earlier ones, found {needs}")
        object.__setattr__(self, "needs", needs)
        if self.writes is not None:
            writes = tuple(int(i) for i in self.writes)
            if any(not 0 <= i <= self.index for i in writes):
                raise ValueError(f"op record {self.index} ({self.op}): writes must name this op or earlier ones, "
                                 f"found {writes}")
            object.__setattr__(self, "writes", writes)
        if self.reads is not None:
            reads = tuple(int(i) for i in self.reads)
            if any(not 0 <= i < self.index for i in reads):
                raise ValueError(f"op record {self.index} ({self.op}): reads must name earlier ops, found {reads}")
            object.__setattr__(self, "reads", reads)
