"""What a stage's backward holds above its inputs where every parameter's ``.grad`` already exists.

A planning pass profiles steps whose gradients are fresh (``zero_grad(set_to_none=True)``): each parameter's
gradient becomes its ``.grad`` and stays allocated, so a stage's o_b is read as its backward's peak less all
the stage's parameter gradients (``Stage.weight_grad_bytes``, which the simulator allocates in ``B``). Budgets
on the activations alone (:func:`~planner.discovery.loss_options.without_weight_grads`, benchmark 10) stand
where every ``.grad`` exists: then no gradient stays allocated, ``AccumulateGrad`` adds each into ``.grad`` and
frees it, and the executor's embeddings (:mod:`planner.executor.embedding_grad`) add their rows into ``.grad``
instead of materialising a gradient the size of the whole weight (GPT-2 small's tied embedding: 147.2 MiB at the
end of the backward, inside stage 1's window, where it set the chain's minimum budget).

o_b there is read from the same timeline, differently: at each row, the parameter gradients allocated since the
stage's backward began (the ``weight_grads`` column as of the row before: a gradient made during the row stays in
its peak, as ``AccumulateGrad``'s transient) are taken off its peak; after each embedding's backward began, the
peak is also lowered by at most the embedding's weight, down to what was allocated at either end of the row. The
result is ``Stage.existing_grads_overhead_bytes``. Measured on a 6-block GPT-2 (tests/planner/executor/
test_chunked_schedule.py), the lowest schedule's forward and backward on a step whose gradients exist peaks
within the prediction band; adding the stage's largest gradient on top over-predicted by 3.5%.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from memprof.phases import Phase
from memprof.trace import Trace
from planner.discovery.chain_finder import ModuleTree
from planner.discovery.step_costs import Timeline, calibrated
from planner.model.chain import Stage

EMBEDDING_KINDS = frozenset({"Embedding"})
"""Module classes whose backward the executor makes add into ``.grad``."""


def module_weights(trace: Trace, iterations: Sequence[int]) -> dict[str, int]:
    """Each module's parameter bytes, as recorded in ``iterations``."""
    layers = trace.read("layers", columns=["iteration", "module", "weight_bytes"], iterations=list(iterations))
    return {str(m): int(b) for m, b in zip(layers.module, layers.weight_bytes)}


def embedding_weights(tree: ModuleTree, weights: Mapping[str, int]) -> dict[str, int]:
    """The run's embeddings (``nn.Embedding``) and their weights' bytes."""
    return {name: weights[name] for name, node in tree.nodes.items()
            if node.kind in EMBEDDING_KINDS and weights.get(name, 0) > 0}


def largest_after(tree: ModuleTree, weights: Mapping[str, int], groups: Sequence[Sequence[str]]) -> int:
    """The largest parameter bytes of a leaf module that runs after the chain, outside it (the loss stage's:
    the head's, whose gradient ``AccumulateGrad`` adds into ``.grad`` at the start of the backward)."""
    chain = [m for group in groups for m in group]

    def inside(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in chain)

    last = max((tree.nodes[m].order for m in chain if m in tree.nodes), default=0)
    return max((weights.get(name, 0) for name, node in tree.nodes.items()
                if name and not tree.children.get(name) and node.order > last and not inside(name)), default=0)


def without_grads(timeline: Timeline, embeddings: Mapping[str, int]) -> Timeline:
    """``timeline`` read as if every ``.grad`` existed before the step (see the module's docstring)."""
    rows = timeline.rows
    grads = rows.weight_grads.to_numpy(dtype=np.int64)
    before = np.concatenate([grads[:1], grads[:-1]])
    allocated = rows.allocated_bytes.to_numpy(dtype=np.int64) - grads
    peaks = np.maximum(rows.peak_bytes.to_numpy(dtype=np.int64) - before, allocated)
    floor = np.maximum(np.concatenate([allocated[:1], allocated[:-1]]), allocated)
    backward = (rows.phase == Phase.BACKWARD).to_numpy()
    for name, size in embeddings.items():
        enter = timeline.backward_enter.get(name)
        if enter is None:
            continue
        where = backward.copy()
        where[: int(rows.index.get_loc(enter)) + 1] = False
        peaks[where] -= np.clip(peaks[where] - floor[where], 0, size)
    return Timeline(rows.assign(allocated_bytes=allocated, peak_bytes=peaks).reset_index())


def with_existing_grads(stages: list[Stage], loss: Stage, timeline: Timeline, groups: tuple[tuple[str, ...], ...],
                        input_bytes: int, embeddings: Mapping[str, int], head_bytes: int) -> tuple[list[Stage], Stage]:
    """``stages`` and ``loss`` with their ``existing_grads_overhead_bytes``. The loss stage's is its o_b and its
    largest gradient's transient (``head_bytes``, :func:`largest_after`): its window is not read again."""
    bare = [replace(stage, weight_grad_bytes=0) for stage in stages]
    read = calibrated(bare, without_grads(timeline, embeddings), groups, input_bytes)
    out = [replace(stage, existing_grads_overhead_bytes=other.backward_overhead_bytes)
           for stage, other in zip(stages, read, strict=True)]
    return out, replace(loss, existing_grads_overhead_bytes=loss.backward_overhead_bytes + head_bytes)
