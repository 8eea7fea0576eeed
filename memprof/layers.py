"""Per-module costs of one iteration (the ROTOR paper's u_f, u_b, a, a-bar, o_f, o_b; section 5.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memprof.attribution import FEATURE, MODEL_STATE_CODES, Call, Sweep
from memprof.timeline import Series

if TYPE_CHECKING:  # the background worker imports this module without torch
    from torch import nn


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


def describe_modules(names: list[str], modules: list[nn.Module], params: list[nn.Parameter]) -> list[ModuleInfo]:
    """Builds :class:`ModuleInfo` for every module (names and modules root first)."""
    index_of_name = {name: i for i, name in enumerate(names)}
    index_of_param = {id(p): i for i, p in enumerate(params)}
    infos = []
    for name, module in zip(names, modules):
        parent = -1 if name == "" else index_of_name.get(name.rpartition(".")[0], 0)
        buffers = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in module.buffers()}
        infos.append(ModuleInfo(
            name=name,
            parent=parent,
            depth=0 if name == "" else name.count(".") + 1,
            kind=type(module).__name__,
            param_indices=tuple(index_of_param[id(p)] for p in module.parameters() if id(p) in index_of_param),
            buffer_bytes=sum(buffers.values()),
        ))
    return infos


class _Blocks:
    """Blocks sorted by allocation change, for fast range queries."""

    def __init__(self, sw: Sweep) -> None:
        alloc = np.asarray(sw.alloc_change, dtype=np.int64)
        order = np.argsort(alloc, kind="stable")
        self.alloc = alloc[order]
        free = np.asarray(sw.free_change, dtype=np.int64)[order]
        self.free = np.where(free < 0, np.iinfo(np.int64).max, free)
        self.size = np.asarray(sw.sizes, dtype=np.int64)[order]
        cats = np.asarray(sw.categories, dtype=np.int64)[order]
        self.activation = ~np.isin(cats, MODEL_STATE_CODES)
        self.feature = cats == FEATURE

    def kept(self, call: Call) -> tuple[int, int]:
        """(activation bytes allocated in the call and alive at its end, feature-map bytes allocated in it)."""
        lo, hi = np.searchsorted(self.alloc, [call.start_change, call.end_change])
        alive = (self.free[lo:hi] >= call.end_change) & self.activation[lo:hi]
        return int(self.size[lo:hi][alive].sum()), int(self.size[lo:hi][self.feature[lo:hi]].sum())


def _overhead(act: np.ndarray, call: Call, kept: int) -> int:
    window = act[call.start_change: call.end_change + 1]
    return max(0, int(window.max() - act[call.start_change] - kept))


def layer_rows(sw: Sweep, s: Series, infos: list[ModuleInfo], iteration: int, order: dict[int, int],
               weight_bytes: list[int], weight_grad_bytes: list[int]) -> list[dict]:
    """One row per module that ran (or holds weights) in this iteration, as the layers table wants."""
    blocks = _Blocks(sw)
    stats: dict[int, dict] = {}

    def row(module: int) -> dict:
        if module not in stats:
            stats[module] = {"calls": 0, "forward_ms": 0.0, "backward_ms": 0.0, "saved_bytes": 0,
                             "feature_map_bytes": 0, "forward_overhead_bytes": 0, "backward_overhead_bytes": 0,
                             "grad_input_bytes": 0, "input_bytes": 0, "output_bytes": 0,
                             "input_ids": [], "output_ids": []}
        return stats[module]

    for call in sw.forward_calls:
        r = row(call.module)
        kept, features = blocks.kept(call)
        if r["calls"] == 0:
            r["input_ids"], r["output_ids"] = list(call.inputs), list(call.outputs)
            r["input_bytes"] = call.input_bytes
        r["calls"] += 1
        r["forward_ms"] += (call.end_ns - call.start_ns) / 1e6
        r["saved_bytes"] += kept
        r["feature_map_bytes"] += features
        r["output_bytes"] += call.output_bytes
        r["forward_overhead_bytes"] = max(r["forward_overhead_bytes"], _overhead(s.activations, call, kept))
    for call in sw.backward_calls:
        r = row(call.module)
        kept, _ = blocks.kept(call)
        r["backward_ms"] += (call.end_ns - call.start_ns) / 1e6
        r["grad_input_bytes"] += kept
        r["backward_overhead_bytes"] = max(r["backward_overhead_bytes"], _overhead(s.activations, call, kept))
    rows = []
    for module, info in enumerate(infos):
        if module not in stats and not info.param_indices:
            continue
        r = row(module)
        r.update(
            iteration=iteration, module=info.name,
            parent=infos[info.parent].name if info.parent >= 0 else "",
            depth=info.depth, order=order.get(module, -1), kind=info.kind,
            weight_bytes=weight_bytes[module], weight_grad_bytes=weight_grad_bytes[module],
            buffer_bytes=info.buffer_bytes,
        )
        rows.append(r)
    return rows


def subtree_bytes(infos: list[ModuleInfo], per_param: dict[int, tuple[int, int]]) -> list[int]:
    """Bytes of unique storages among each module's parameters, from ``param index -> (ptr, nbytes)``."""
    out = []
    for info in infos:
        unique = {per_param[i][0]: per_param[i][1] for i in info.param_indices if i in per_param}
        out.append(sum(unique.values()))
    return out
