"""Small synthetic traces for the dashboard tests, written with memprof's own writer.

``make_traces(root)`` writes:

- ``mlp``: a profiled run of a 5-layer chain (``features.0`` .. ``features.4``) with 3 iterations.
  One layer is named ``<img src=x onerror=alert(1)>`` to prove names are shown as text.
- ``mlp-measured``: a measured run: its ``meta.json`` holds a schedule (a hand-written store-all
  schedule of a hand-written chain with the step costs :data:`STEP`) and ``source_run = "mlp"``.
- ``ddp/rank=0`` and ``ddp/rank=1``: the two ranks of a distributed run.
- ``corrupt``: ``meta.json`` is not JSON.
- ``foreign``: ``meta.json`` belongs to another tool.

Every number is derived from the constants below, so tests can compute expected values by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from memprof.categories import CATEGORY_COLUMNS
from memprof.schema import EVENTS, EVENTS_SCHEMA, FORMAT_NAME, ITERATIONS, LAYERS, SCHEMA_VERSION
from memprof.trace.format.writer import TraceWriter, write_meta

HTML_NAME = "<img src=x onerror=alert(1)>"
#: Child names of ``features`` in the synthetic model.
CHILDREN: tuple[str, ...] = ("0", "1", HTML_NAME, "3", "4")
KINDS: tuple[str, ...] = ("Linear", "ReLU", "Linear", "ReLU", "Linear")
LAYER_WEIGHT_BYTES: tuple[int, ...] = (4096 * 4 + 64 * 4, 0, 64 * 64 * 4 + 64 * 4, 0, 64 * 10 * 4 + 10 * 4)
WEIGHTS_BYTES = sum(LAYER_WEIGHT_BYTES)
#: Output bytes of each child: a batch of 32 by the layer's width, float32.
OUTPUT_BYTES: tuple[int, ...] = (32 * 64 * 4, 32 * 64 * 4, 32 * 64 * 4, 32 * 64 * 4, 32 * 10 * 4)
INPUT_BYTES = 32 * 1024 * 4
STEP_NS = 100_000  # 0.1 ms between consecutive events
TRANSIENT_BYTES = 512  # peak_bytes exceeds allocated_bytes by this much at every event


@dataclass(frozen=True)
class Traces:
    """Where the synthetic runs were written and their names."""

    root: Path
    profiled: str = "mlp"
    measured: str = "mlp-measured"
    corrupt: str = "corrupt"
    foreign: str = "foreign"
    ranks: tuple[str, ...] = ("ddp/rank=0", "ddp/rank=1")


def meta(run_id: str, model: str = "Net", rank: int = 0, world_size: int = 1, **extra: object) -> dict:
    """A valid ``meta.json`` body."""
    return {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, "run_id": run_id,
            "created_at": "2026-01-02T03:04:05", "device": "cpu", "torch_version": "2.13.0", "model": model,
            "rank": rank, "world_size": world_size, **extra}


def activation_profile(scale: int = 1) -> list[tuple[str, str, str, int]]:
    """``(phase, module, event, activation bytes)`` of one iteration: forward grows, backward frees."""
    names = [f"features.{c}" for c in CHILDREN]
    live = INPUT_BYTES
    # Like memprof's own traces: an "other start" row, then one row per hook mark, then "other end".
    steps: list[tuple[str, str, str, int]] = [("other", "", "start", live), ("forward", "", "enter", live)]
    for name, out in zip(names, OUTPUT_BYTES):
        steps.append(("forward", name, "enter", live))
        live += out * scale
        steps.append(("forward", name, "exit", live))
    steps.append(("forward", "", "exit", live))
    for name, out in zip(reversed(names), reversed(OUTPUT_BYTES)):
        steps.append(("backward", name, "enter", live + out))
        live -= out * scale
        steps.append(("backward", name, "exit", live))
    steps.append(("backward", "", "end", live))
    steps.append(("optimizer", "", "enter", live))
    steps.append(("optimizer", "", "exit", INPUT_BYTES))
    steps.append(("other", "", "end", INPUT_BYTES))
    return steps


def event_rows(iteration: int, profile: list[tuple[str, str, str, int]], start_ns: int = 0) -> list[dict]:
    """Events of one iteration; categories sum to ``allocated_bytes`` at every event."""
    rows = []
    for seq, (phase, module, event, activation) in enumerate(profile):
        backward_or_later = phase in ("backward", "optimizer") or (phase == "other" and event == "end")
        cats = dict.fromkeys(CATEGORY_COLUMNS, 0)
        cats["weights"] = WEIGHTS_BYTES
        cats["weight_grads"] = WEIGHTS_BYTES if backward_or_later else 0
        cats["optimizer_state"] = WEIGHTS_BYTES if phase == "optimizer" or (phase, event) == ("other", "end") else 0
        cats["inputs"] = INPUT_BYTES
        cats["grads"] = (activation - INPUT_BYTES) // 4 if phase == "backward" else 0
        cats["feature_maps"] = activation - INPUT_BYTES - cats["grads"]
        allocated = sum(cats.values())
        rows.append({"iteration": iteration, "seq": seq, "time_ns": start_ns + seq * STEP_NS, "phase": phase,
                     "module": module, "event": event, "allocated_bytes": allocated,
                     "peak_bytes": allocated + TRANSIENT_BYTES, "peak_activation_bytes": activation + TRANSIENT_BYTES,
                     "reserved_bytes": (allocated // 65536 + 1) * 65536,
                     **cats})
    return rows


def iteration_row(iteration: int, events: list[dict]) -> dict:
    """The iterations-table row summarising one iteration's events."""
    peak = max(events, key=lambda r: r["peak_bytes"])
    return {"iteration": iteration, "epoch": 0, "step_ms": len(events) * STEP_NS / 1e6,
            "peak_allocated_bytes": peak["peak_bytes"], "peak_reserved_bytes": max(r["reserved_bytes"] for r in events),
            "allocated_bytes": events[-1]["allocated_bytes"], "reserved_bytes": events[-1]["reserved_bytes"],
            "peak_phase": peak["phase"], "peak_module": peak["module"], "num_events": len(events),
            "num_allocations": len(events), "detail": True, "micro_batches": 1,
            **{c: peak[c] for c in CATEGORY_COLUMNS}}


def layer_rows(iteration: int) -> list[dict]:
    """One row per module: the root, the ``features`` container and its five children (a chain)."""
    def row(module: str, parent: str, depth: int, order: int, kind: str, weight: int, out: int,
            inputs: list[int], outputs: list[int]) -> dict:
        return {"iteration": iteration, "module": module, "parent": parent, "depth": depth, "order": order,
                "kind": kind, "calls": 1, "weight_bytes": weight, "weight_grad_bytes": weight, "buffer_bytes": 0,
                "feature_map_bytes": out, "input_bytes": out, "output_bytes": out, "saved_bytes": out * 2,
                "grad_input_bytes": out, "forward_ms": 0.1 * (order + 1), "backward_ms": 0.2 * (order + 1),
                "forward_overhead_bytes": 0, "backward_overhead_bytes": 0, "input_ids": inputs,
                "output_ids": outputs}

    total_out = sum(OUTPUT_BYTES)
    rows = [row("", "", 0, 0, "Net", WEIGHTS_BYTES, total_out, [1], [1 + len(CHILDREN)]),
            row("features", "", 1, 1, "Sequential", WEIGHTS_BYTES, total_out, [1], [1 + len(CHILDREN)])]
    for i, (child, kind, weight, out) in enumerate(zip(CHILDREN, KINDS, LAYER_WEIGHT_BYTES, OUTPUT_BYTES)):
        rows.append(row(f"features.{child}", "features", 2, 2 + i, kind, weight, out, [1 + i], [2 + i]))
    return rows


def write_profiled_run(run_dir: Path, run_id: str, iterations: int = 3, scale: int = 1, first: int = 0,
                       **extra: object) -> None:
    """A readable run with ``iterations`` iterations from ``first``; iteration ``i`` has activations
    ``scale + i`` times larger."""
    writer = TraceWriter(run_dir)
    for iteration in range(first, first + iterations):
        events = event_rows(iteration, activation_profile(scale + iteration), start_ns=iteration * 10**9)
        writer.append(EVENTS, events)
        writer.append(ITERATIONS, [iteration_row(iteration, events)])
        writer.append(LAYERS, layer_rows(iteration))
    write_meta(run_dir, meta(run_id, **extra))


#: Step costs of the hand-written measured chain, as the synthetic events hold them: the weights and the
#: batch beside the chain, the optimizer step (weights, gradients, state, batch) after it.
STEP_COSTS = {"model_state_bytes": WEIGHTS_BYTES, "inputs_bytes": INPUT_BYTES, "outside_bytes": 0,
              "before_peak_bytes": WEIGHTS_BYTES + INPUT_BYTES + TRANSIENT_BYTES,
              "after_peak_bytes": 3 * WEIGHTS_BYTES + INPUT_BYTES + TRANSIENT_BYTES,
              "optimizer_step_bytes": TRANSIENT_BYTES}


def store_all_schedule_dict(step: bool = True) -> dict:
    """A hand-written chain of 3 stages and its store-all schedule, as ``Schedule.to_dict`` writes it.

    With ``step`` the chain carries :data:`STEP_COSTS` (as a chain found in a run does), so its budgets and
    predicted peak are the whole step's; without, it is a chain-only schedule.
    """
    from planner.model.chain import Chain, Stage
    from planner.model.schedule import Op, OpKind, Schedule
    from planner.model.step import StepCosts
    from planner.simulation.simulator import simulate

    stages = [Stage(1.0, 2.0, 1000, 1500, 1000, name=f"features.{i}") for i in range(3)]
    chain = Chain("features", 500, (*stages, Stage(0.5, 0.5, 10, 10, 10, name="loss")),
                  step=StepCosts(**STEP_COSTS) if step else None)
    ops = [Op(OpKind.F_ALL, s) for s in range(1, 5)] + [Op(OpKind.B, s) for s in range(4, 0, -1)]
    schedule = Schedule("store_all", None, tuple(ops), chain)
    prediction = simulate(chain, schedule)
    return schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms).to_dict()


def write_measured_run(run_dir: Path, run_id: str, source_run: str, step: bool = True) -> None:
    """A run that executed :func:`store_all_schedule_dict` (one iteration)."""
    writer = TraceWriter(run_dir)
    events = event_rows(0, activation_profile(1))
    writer.append(EVENTS, events)
    writer.append(ITERATIONS, [iteration_row(0, events)])
    writer.append(LAYERS, layer_rows(0))
    write_meta(run_dir, meta(run_id, schedule=store_all_schedule_dict(step), source_run=source_run))


def make_traces(root: Path, with_measured: bool = True) -> Traces:
    """Writes every synthetic run under ``root`` and returns their names."""
    traces = Traces(root)
    write_profiled_run(root / traces.profiled, "mlp")
    if with_measured:
        write_measured_run(root / traces.measured, "mlp-measured", source_run="mlp")
    for rank, name in enumerate(traces.ranks):
        write_profiled_run(root / name, "ddp", iterations=2, scale=1 + rank, rank=rank, world_size=2)
    (root / traces.corrupt).mkdir()
    (root / traces.corrupt / "meta.json").write_text("{not json", encoding="utf-8")
    (root / traces.foreign).mkdir()
    (root / traces.foreign / "meta.json").write_text(json.dumps({"format": "other-tool"}), encoding="utf-8")
    return traces


def measured_expectations() -> tuple[int, float]:
    """Activation peak (bytes) and forward+backward span (ms) of the measured run, from the constants."""
    profile = activation_profile(1)
    inside = [i for i, p in enumerate(profile) if p[0] in ("forward", "backward")]
    # Activation = allocated - model state; peak_bytes adds the transient to every event.
    peak = max(profile[i][3] for i in inside) + TRANSIENT_BYTES
    # From the first forward "enter" to the backward "end", one STEP_NS per event.
    span_ms = (inside[-1] - inside[0]) * STEP_NS / 1e6
    return peak, span_ms


def measured_step_expectations() -> tuple[int, list[int], list[float]]:
    """The measured run's whole-step peak (the allocator's, over every event of its one iteration), and its
    allocated bytes and times (ms since the first forward event) over forward, backward and the optimizer."""
    events = event_rows(0, activation_profile(1))
    inside = [r for r in events if r["phase"] in ("forward", "backward", "optimizer")]
    origin = inside[0]["time_ns"]
    return (max(r["peak_bytes"] for r in events), [r["allocated_bytes"] for r in inside],
            [(r["time_ns"] - origin) / 1e6 for r in inside])


def write_big_events(run_dir: Path, num_events: int, seed: int = 0) -> None:
    """A run whose single iteration has ``num_events`` events (for downsampling tests and benchmarks)."""
    rng = np.random.default_rng(seed)
    n = num_events
    steps = rng.integers(-4096, 4097, size=n)
    activation = np.abs(np.cumsum(steps)) + INPUT_BYTES
    activation[n // 3] += 50_000_000  # one tall spike that downsampling must keep
    phase = np.where(np.arange(n) < n // 2, "forward", np.where(np.arange(n) < n * 9 // 10, "backward", "optimizer"))
    columns: dict[str, object] = {c: np.zeros(n, dtype=np.int64) for c in CATEGORY_COLUMNS}
    columns["weights"] = np.full(n, WEIGHTS_BYTES, dtype=np.int64)
    columns["inputs"] = np.full(n, INPUT_BYTES, dtype=np.int64)
    columns["feature_maps"] = activation - INPUT_BYTES
    allocated = sum(columns[c] for c in CATEGORY_COLUMNS)
    module = np.where(np.arange(n) == n // 3, "features.spike", "features.0")
    data = {"iteration": np.zeros(n, dtype=np.int64), "seq": np.arange(n, dtype=np.int64),
            "time_ns": np.arange(n, dtype=np.int64) * 1000, "phase": phase, "module": module,
            "event": np.full(n, "alloc"), "allocated_bytes": allocated, "peak_bytes": allocated + TRANSIENT_BYTES,
            "peak_activation_bytes": activation + TRANSIENT_BYTES, "reserved_bytes": allocated + 1024, **columns}
    writer = TraceWriter(run_dir)
    writer.append(EVENTS, pa.Table.from_pydict({f.name: data[f.name] for f in EVENTS_SCHEMA}, schema=EVENTS_SCHEMA))
    peak_at = int(np.argmax(allocated))
    summary = {c: int(columns[c][peak_at]) for c in CATEGORY_COLUMNS}
    writer.append(ITERATIONS, [{"iteration": 0, "epoch": 0, "step_ms": n / 1000, "peak_allocated_bytes":
                                int(allocated[peak_at]) + TRANSIENT_BYTES, "peak_reserved_bytes": int(allocated.max()) + 1024,
                                "allocated_bytes": int(allocated[-1]), "reserved_bytes": int(allocated[-1]) + 1024,
                                "peak_phase": str(phase[peak_at]), "peak_module": str(module[peak_at]),
                                "num_events": n, "num_allocations": n, "detail": True, "micro_batches": 1,
                                **summary}])
    writer.append(LAYERS, layer_rows(0))
    write_meta(run_dir, meta(run_dir.name))


def write_chain_run(run_dir: Path, stages: int, iterations: int = 2, seed: int = 0) -> None:
    """A run of a model whose container ``layers`` holds a chain of ``stages`` layers of varied costs."""
    rng = np.random.default_rng(seed)
    outputs = rng.integers(1, 64, size=stages) * 65536
    forward = rng.uniform(0.5, 5.0, size=stages)
    writer = TraceWriter(run_dir)
    for iteration in range(iterations):
        rows = []
        base = {"iteration": iteration, "calls": 1, "buffer_bytes": 0, "grad_input_bytes": 0,
                "forward_overhead_bytes": 0, "backward_overhead_bytes": 0}
        total = int(outputs.sum())
        rows.append({**base, "module": "", "parent": "", "depth": 0, "order": 0, "kind": "Deep",
                     "weight_bytes": 0, "weight_grad_bytes": 0, "feature_map_bytes": total, "input_bytes": 4096,
                     "output_bytes": int(outputs[-1]), "saved_bytes": total, "forward_ms": float(forward.sum()),
                     "backward_ms": float(2 * forward.sum()), "input_ids": [0], "output_ids": [stages]})
        rows.append({**rows[0], "module": "layers", "depth": 1, "order": 1, "kind": "Sequential"})
        for i in range(stages):
            out = int(outputs[i])
            rows.append({**base, "module": f"layers.{i}", "parent": "layers", "depth": 2, "order": 2 + i,
                         "kind": "Linear", "weight_bytes": 4096, "weight_grad_bytes": 4096, "feature_map_bytes": out,
                         "input_bytes": int(outputs[i - 1]) if i else 4096, "output_bytes": out,
                         "saved_bytes": out + (int(outputs[i - 1]) if i else 4096) // 2,
                         "forward_ms": float(forward[i]), "backward_ms": float(2 * forward[i]),
                         "input_ids": [i], "output_ids": [i + 1]})
        writer.append(LAYERS, rows)
        events = event_rows(iteration, activation_profile(1), start_ns=iteration * 10**9)
        writer.append(EVENTS, events)
        writer.append(ITERATIONS, [iteration_row(iteration, events)])
    write_meta(run_dir, meta(run_dir.name, model="Deep"))


def profile_mlp(root: Path, run_id: str = "mlp") -> tuple:
    """Profiles the example MLP (3 blocks of 64, batch 256) for 3 steps into ``root/run_id``, as a user would.

    Returns:
        ``(make_batch, zoo)``: the batch maker, to measure a schedule on the same data, and the example models.
    """
    import torch

    from examples import zoo
    from memprof import MemoryProfiler

    torch.manual_seed(0)
    model, make_batch = zoo.mlp(blocks=3, width=64, in_features=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryProfiler(model, optimizer, out_dir=root, run_id=run_id, print_period=0) as profiler:
        for _ in range(3):
            zoo.train_step(model, optimizer, make_batch(256))
            profiler.record_stats()
    return make_batch, zoo
