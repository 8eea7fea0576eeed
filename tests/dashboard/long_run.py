"""A synthetic long training run for the dashboard's tests and benchmarks: many iterations, few detailed.

``write_long_run(run_dir, iterations)`` writes a run of a ~100-module model laid out as memprof's
background worker writes one: the iterations come in batches of ``part_iterations``; each batch writes
one part of ``iterations`` and, when it holds detailed iterations, one part of ``layers`` and one of
``events`` with the rows of those iterations only. Detailed are the first :data:`FIRST_DETAILED`
iterations, every ``every``-th and :attr:`LongRun.detailed_spike`, as a detail policy would choose.

The run's highest peak (:attr:`LongRun.peak_iteration`) is an iteration without detail unless ``every``
divides it (``every=1``: every iteration detailed, as before the detail policy), so tests can tell the
run's peak from the highest detailed one (:attr:`LongRun.detailed_spike`). Everything is built
with numpy and written as whole Arrow tables, so 100,000 iterations take seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from memprof.categories import CATEGORY_COLUMNS
from memprof.schema import EVENTS, EVENTS_SCHEMA, ITERATIONS, ITERATIONS_SCHEMA, LAYERS, LAYERS_SCHEMA
from memprof.trace.format.writer import TraceWriter, write_meta
from tests.dashboard.fixtures import meta

MIB = 1024**2
WEIGHTS_BYTES = 64 * MIB
INPUT_BYTES = 8 * MIB
ACTIVATION_BYTES = 512 * MIB  # the activations an ordinary iteration peaks with
FIRST_DETAILED = 10
BLOCKS = 24  # blocks.0 .. blocks.23, each with attn, mlp and norm: 100 modules with root, embed, blocks, head
EVENT_NS = 20_000  # 20 us between consecutive events


@dataclass(frozen=True)
class LongRun:
    """What :func:`write_long_run` wrote.

    Attributes:
        iterations: how many iterations the run recorded.
        detail: the detailed iterations, ascending.
        peak_iteration: the iteration with the run's highest peak.
        detailed_spike: the detailed iteration with the highest peak.
        modules: modules (layers rows) per detailed iteration.
        events_per_iteration: events rows per detailed iteration.
    """

    iterations: int
    detail: tuple[int, ...]
    peak_iteration: int
    detailed_spike: int
    modules: int
    events_per_iteration: int


def module_tree() -> list[tuple[str, str, int, str]]:
    """``(module, parent, depth, kind)`` of the synthetic model, in forward order."""
    rows = [("", "", 0, "Transformer"), ("embed", "", 1, "Embedding"), ("blocks", "", 1, "Sequential")]
    for b in range(BLOCKS):
        rows.append((f"blocks.{b}", "blocks", 2, "Block"))
        rows += [(f"blocks.{b}.{c}", f"blocks.{b}", 3, k) for c, k in (("attn", "Attention"), ("mlp", "MLP"),
                                                                        ("norm", "LayerNorm"))]
    rows.append(("head", "", 1, "Linear"))
    return rows


def activation_peaks(iterations: int, peak_iteration: int, detailed_spike: int, seed: int = 0) -> np.ndarray:
    """Activation bytes at each iteration's peak: a slow wave, noise, and two spikes."""
    rng = np.random.default_rng(seed)
    i = np.arange(iterations)
    wave = 1.0 + 0.05 * np.sin(i / 500.0) + rng.uniform(-0.02, 0.02, size=iterations)
    activations = (ACTIVATION_BYTES * wave).astype(np.int64)
    activations[detailed_spike] = int(ACTIVATION_BYTES * 1.5)
    activations[peak_iteration] = int(ACTIVATION_BYTES * 2)
    return activations


def _iterations_table(first: int, activations: np.ndarray, detail: np.ndarray) -> pa.Table:
    n = len(activations)
    peak = 3 * WEIGHTS_BYTES + INPUT_BYTES + activations  # weights, their grads' slot, optimizer state, batch
    cats = {c: np.zeros(n, dtype=np.int64) for c in CATEGORY_COLUMNS}
    cats.update(weights=np.full(n, WEIGHTS_BYTES), optimizer_state=np.full(n, 2 * WEIGHTS_BYTES),
                inputs=np.full(n, INPUT_BYTES), feature_maps=activations)
    reserved = (peak // (64 * MIB) + 1) * 64 * MIB
    data = {"iteration": np.arange(first, first + n), "epoch": np.zeros(n, dtype=np.int64),
            "step_ms": np.full(n, 50.0), "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved,
            "allocated_bytes": np.full(n, 3 * WEIGHTS_BYTES), "reserved_bytes": reserved,
            "peak_phase": np.full(n, "forward"), "peak_module": np.full(n, "blocks.23.mlp"),
            "num_events": np.where(detail, len(_event_template()[3]), 0), "num_allocations": np.full(n, 1000), "detail": detail,
            "micro_batches": np.ones(n, dtype=np.int64), "template_iteration": np.full(n, -1), **cats}
    return pa.Table.from_pydict({f.name: data[f.name] for f in ITERATIONS_SCHEMA}, schema=ITERATIONS_SCHEMA)


def _layers_table(iterations: np.ndarray, activations: np.ndarray) -> pa.Table:
    tree = module_tree()
    m, k = len(tree), len(iterations)
    share = np.linspace(1.0, 2.0, m)  # later modules keep a little more
    out = (np.outer(activations, share / share.sum())).astype(np.int64).ravel()
    weight = np.tile(np.full(m, WEIGHTS_BYTES // m), k)
    data = {"iteration": np.repeat(iterations, m), "module": [t[0] for t in tree] * k,
            "parent": [t[1] for t in tree] * k, "depth": np.tile([t[2] for t in tree], k),
            "order": np.tile(np.arange(m), k), "kind": [t[3] for t in tree] * k, "calls": np.ones(m * k, np.int64),
            "weight_bytes": weight, "weight_grad_bytes": weight, "buffer_bytes": np.zeros(m * k, np.int64),
            "feature_map_bytes": out, "weight_copy_bytes": np.zeros(m * k, np.int64),
            "comm_buffer_bytes": np.zeros(m * k, np.int64), "input_bytes": out, "output_bytes": out, "saved_bytes": 2 * out,
            "grad_input_bytes": out, "forward_ms": np.tile(np.linspace(0.1, 1.0, m), k),
            "backward_ms": np.tile(np.linspace(0.2, 2.0, m), k), "forward_overhead_bytes": np.zeros(m * k, np.int64),
            "backward_overhead_bytes": np.zeros(m * k, np.int64),
            "input_ids": [[j] for _ in range(k) for j in range(m)], "output_ids": [[j + 1] for _ in range(k) for j in range(m)]}
    return pa.Table.from_pydict({f.name: data[f.name] for f in LAYERS_SCHEMA}, schema=LAYERS_SCHEMA)


def _event_template() -> tuple[list[str], list[str], list[str], np.ndarray]:
    """Phase, module, event and the activations' share (0..1) of one iteration's events."""
    names = [t[0] for t in module_tree()]
    phases, modules, kinds, share = ["other"], [""], ["start"], [0.0]
    for j, name in enumerate(names):
        phases += ["forward", "forward"]
        modules += [name, name]
        kinds += ["enter", "exit"]
        share += [j / len(names), (j + 1) / len(names)]
    for j, name in reversed(list(enumerate(names))):
        phases += ["backward", "backward"]
        modules += [name, name]
        kinds += ["enter", "exit"]
        share += [(j + 1) / len(names), j / len(names)]
    phases += ["optimizer", "optimizer", "other"]
    modules += ["", "", ""]
    kinds += ["enter", "exit", "end"]
    share += [0.0, 0.0, 0.0]
    return phases, modules, kinds, np.array(share)


def _events_table(iterations: np.ndarray, activations: np.ndarray) -> pa.Table:
    phases, modules, kinds, share = _event_template()
    e, k = len(share), len(iterations)
    feature_maps = (np.outer(activations, share)).astype(np.int64).ravel()
    cats = {c: np.zeros(e * k, dtype=np.int64) for c in CATEGORY_COLUMNS}
    cats.update(weights=np.full(e * k, WEIGHTS_BYTES), optimizer_state=np.full(e * k, 2 * WEIGHTS_BYTES),
                inputs=np.full(e * k, INPUT_BYTES), feature_maps=feature_maps)
    allocated = sum(cats[c] for c in CATEGORY_COLUMNS)
    starts = np.repeat(iterations * 10**9, e)
    data = {"iteration": np.repeat(iterations, e), "seq": np.tile(np.arange(e), k),
            "time_ns": starts + np.tile(np.arange(e) * EVENT_NS, k), "phase": phases * k, "module": modules * k,
            "event": kinds * k, "allocated_bytes": allocated, "peak_bytes": allocated,
            "peak_activation_bytes": feature_maps, "reserved_bytes": (allocated // (64 * MIB) + 1) * 64 * MIB, **cats}
    return pa.Table.from_pydict({f.name: data[f.name] for f in EVENTS_SCHEMA}, schema=EVENTS_SCHEMA)


def write_long_run(run_dir: Path, iterations: int, every: int = 100, part_iterations: int = 16,
                   seed: int = 0, compact: bool = True) -> LongRun:
    """Writes a run of ``iterations`` iterations whose first ten, every ``every``-th and one spike have detail.

    Args:
        run_dir: the run directory to create.
        iterations: how many iterations (at least 100).
        every: every ``every``-th iteration is detailed (1: all).
        part_iterations: iterations per batch (one part of each table per batch), as the worker writes.
        seed: seed of the noise on the peaks.
        compact: merge the parts after each batch, as the writer does (``False``: one part per batch and
            table, the layout before compaction).
    """
    if iterations < 100:
        raise ValueError(f"a long run needs at least 100 iterations, found {iterations}")
    peak_iteration = iterations * 3 // 5 + 7  # not a multiple of ``every`` for the usual choices
    detailed_spike = iterations * 2 // 5 + 13
    activations = activation_peaks(iterations, peak_iteration, detailed_spike, seed)
    index = np.arange(iterations)
    detail = (index < FIRST_DETAILED) | (index % every == 0) | (index == detailed_spike)
    writer = TraceWriter(run_dir)
    for first in range(0, iterations, part_iterations):
        batch = slice(first, min(first + part_iterations, iterations))
        chosen = index[batch][detail[batch]]
        if len(chosen):
            writer.append(LAYERS, _layers_table(chosen, activations[chosen]))
            writer.append(EVENTS, _events_table(chosen, activations[chosen]))
        writer.append(ITERATIONS, _iterations_table(first, activations[batch], detail[batch]))
        if compact:
            writer.compact()
    write_meta(run_dir, meta(run_dir.name, model="Transformer", iterations=iterations))
    return LongRun(iterations=iterations, detail=tuple(int(i) for i in index[detail]), peak_iteration=peak_iteration,
                   detailed_spike=detailed_spike, modules=len(module_tree()), events_per_iteration=len(_event_template()[3]))
