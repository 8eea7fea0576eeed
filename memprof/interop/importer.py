"""``import_snapshot``: a PyTorch CUDA memory snapshot as a memprof trace the dashboard and reader open.

The history of each device (:mod:`memprof.interop.replay`) is cut into iterations with marks and observed
categories (:mod:`memprof.interop.steps`) and analysed by memprof's own analysis: the sweep that attributes
blocks (:func:`~memprof.analysis.attribution.sweep`), the per-category series, the peak summary, the layer
rows and the timeline rows (:mod:`memprof.analysis.timeline`), written through the trace writer. Torch-free.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memprof.analysis.detail import DetailPolicy
from memprof.analysis.failure import failure_details
from memprof.analysis.iteration import ProcessedIteration
from memprof.analysis.layers import layer_rows
from memprof.analysis.records import CAT, AllocationEvents, LiveBlock, ModuleInfo
from memprof.analysis.sweep import sweep
from memprof.analysis.timeline import peak_summary, series, timeline_rows
from memprof.errors import OutputExistsError, SnapshotFormatError
from memprof.interop.marks import Step
from memprof.interop.replay import Replay, devices, replay
from memprof.interop.snapshot_file import load_snapshot
from memprof.interop.steps import Plan, plan_steps
from memprof.schema import FORMAT_NAME, SCHEMA_VERSION
from memprof.trace.format.writer import TraceWriter, write_iterations, write_meta
from memprof.units import format_bytes

#: ``meta.json``'s ``source`` for an imported run.
SOURCE = "pytorch-snapshot"
_BATCH = 16  # iterations per flush, as the profiler's worker writes them


def import_snapshot(path: str | Path, out_dir: str | Path, run_id: str | None = None, *, device: int | None = None,
                    force: bool = False) -> Path:
    """Turns a snapshot file into a memprof run directory.

    Every device with entries or segments is imported: one device into ``out_dir`` itself, several into
    ``out_dir/rank=<i>`` (the i-th such device; ``meta.json``'s ``device`` names it), unless ``device`` picks
    one. The run is built in a hidden folder beside ``out_dir`` and renamed into place, so a failed import
    leaves nothing and never a half-written run.

    Args:
        path: the pickle ``torch.cuda.memory._dump_snapshot`` wrote.
        out_dir: the run directory to create (its parent is created if missing).
        run_id: the run's name in ``meta.json`` (default: ``out_dir``'s name).
        device: import only this CUDA device.
        force: replace ``out_dir`` if it exists (it is kept until the new run is complete).

    Returns:
        ``out_dir``.

    Raises:
        SnapshotFormatError: the file is not a snapshot, or has nothing for ``device``.
        OutputExistsError: ``out_dir`` exists, is not empty and ``force`` is false.
    """
    snapshot = load_snapshot(path)
    out = Path(out_dir)
    _check_output(out, force)
    found = devices(snapshot)
    if device is not None and device not in found:
        raise SnapshotFormatError(f"{path} has no entries or segments for device {device}; it has "
                                  f"{found or 'none'}")
    chosen = [device] if device is not None else (found or [0])
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.parent / f".{out.name}.import-{uuid.uuid4().hex[:8]}.tmp"
    try:
        for rank, index in enumerate(chosen):
            run_dir = building if len(chosen) == 1 else building / f"rank={rank}"
            _write_device(snapshot, index, run_dir, {
                "run_id": run_id or out.name, "rank": rank, "world_size": len(chosen),
                "source_file": Path(path).name})
        _move_into_place(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return out


def _check_output(out: Path, force: bool) -> None:
    if force or not out.exists():
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    raise OutputExistsError(f"{out} already exists and is not empty; choose another --out or pass --force to "
                            "replace it")


def _move_into_place(building: Path, out: Path) -> None:
    """Renames the finished run over ``out``; an existing ``out`` is removed only once the new one is there."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        old = out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:8]}.tmp"
        os.rename(out, old)
        try:
            os.rename(building, out)
        except BaseException:
            os.rename(old, out)
            raise
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
        return
    if out.is_dir():
        out.rmdir()
    os.rename(building, out)


def _write_device(snapshot: Mapping[str, Any], device: int, run_dir: Path, names: Mapping[str, Any]) -> None:
    history = replay(snapshot, device)
    try:
        processed, failure = analyse(history, plan_steps(history))
    except OverflowError:  # each size fits int64 (checked), their running total may not
        raise SnapshotFormatError(f"the allocated bytes of device {device} add up beyond what 64 bits hold; the "
                                  "snapshot's sizes are not a real allocator's") from None
    writer = TraceWriter(run_dir)
    for first in range(0, len(processed), _BATCH):
        write_iterations(writer, processed[first: first + _BATCH])
    meta = _meta(snapshot, history, [p.iteration for p in processed], names)
    if failure is not None:
        meta.update(status="failed", failure=failure)
    write_meta(run_dir, meta)


def analyse(history: Replay, plan: Plan) -> tuple[list[ProcessedIteration], dict[str, Any] | None]:
    """Each step's rows, through memprof's analysis; and the post-mortem of the last ``oom`` entry, if any."""
    table = plan.modules
    infos = [ModuleInfo(name, parent, depth, kind, (), 0)
             for name, parent, depth, kind in zip(table.names, table.parents, table.depths, table.kinds)]
    zeros = [0] * len(infos)
    carried = [LiveBlock(-k - 1, b.addr, b.size, CAT[category])
               for k, (b, category) in enumerate(zip(history.initial, plan.initial_categories))]
    allocated = sum(b.size for b in history.initial)
    next_id = 1
    order: dict[int, int] = {}  # module -> position of its first forward call, as the profiler keeps it
    processed: list[ProcessedIteration] = []
    failure = None
    for step in plan.steps:
        events, allocated = _allocation_events(step, allocated)
        sw = sweep(events, step.marks, step.observations, [], carried, table.parents, next_id, use_truth=False)
        if len(sw.change_block) != len(events):
            raise SnapshotFormatError(f"iteration {step.iteration} of device {history.device}: the snapshot's trace "
                                      "allocates or frees addresses inconsistently; memprof cannot rebuild its "
                                      "timeline")
        s = series(sw, use_truth=False)
        for call in sorted(sw.forward_calls, key=lambda c: c.start_ns):
            order.setdefault(call.module, len(order))
        layers = layer_rows(sw, s, infos, step.iteration, order, zeros, zeros)
        rows = step.rows
        frame = timeline_rows(s, step.iteration, [r.state for r in rows], [r.time_ns for r in rows],
                              [r.phase for r in rows], [r.module for r in rows], [r.event for r in rows],
                              [r.reserved_bytes for r in rows])
        reserved = [r.reserved_bytes for r in rows]
        row = {"iteration": step.iteration, "epoch": 0, "step_ms": (step.end_ns - step.start_ns) / 1e6,
               "peak_reserved_bytes": max(reserved), "reserved_bytes": reserved[-1], "num_events": len(rows),
               "num_allocations": sum(1 for e in step.entries if e.action == "alloc"), "detail": True,
               "micro_batches": 1,  # each run of forward entries is one root forward: a step is never split
               **peak_summary(sw, s, table.names)}
        processed.append(ProcessedIteration(step.iteration, row, layers, frame))
        if step.oom is not None:
            entry, module = step.oom
            failure = {"kind": "oom", "module": module, "budget_bytes": None,
                       "message": f"CUDA out of memory: {format_bytes(entry.size)} requested with "
                                  f"{format_bytes(entry.device_free)} free on the device (the snapshot's oom entry)",
                       **failure_details(frame, layers, step.iteration)}
        carried = [LiveBlock(sw.block_ids[i], ptr, sw.sizes[i], sw.categories[i]) for ptr, i in sw.live.items()]
        next_id = sw.next_block_id
    return processed, failure


def _allocation_events(step: Step, allocated: int) -> tuple[AllocationEvents, int]:
    """The step's allocs and frees as the analysis takes them, with the running totals; and the total after."""
    times, ptrs, sizes, totals, reserved = [], [], [], [], []
    level = step.reserved_start_bytes
    for entry in step.entries:
        if entry.action in ("segment_alloc", "segment_map"):
            level += entry.size
        elif entry.action in ("segment_free", "segment_unmap"):
            level -= entry.size
        if entry.action not in ("alloc", "free_completed"):
            continue
        signed = entry.size if entry.action == "alloc" else -entry.size
        allocated += signed
        times.append(entry.time_ns)
        ptrs.append(entry.addr)
        sizes.append(signed)
        totals.append(allocated)
        reserved.append(level)
    arrays = [np.asarray(v, dtype=np.int64) for v in (times, ptrs, sizes, totals, reserved)]
    return AllocationEvents(*arrays), allocated


def _meta(snapshot: Mapping[str, Any], history: Replay, iterations: list[int], names: Mapping[str, Any]
          ) -> dict[str, Any]:
    settings = snapshot.get("allocator_settings")
    try:
        json.dumps(settings)
    except (TypeError, ValueError):
        settings = repr(settings)
    return {
        "format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, **names,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": f"cuda:{history.device}", "torch_version": "unknown", "python": None, "model": "unknown",
        "optimizer": None, "truth": SOURCE, "allocator_source": SOURCE, "source": SOURCE,
        "status": "closed", "iterations": len(iterations), "epochs": 0, "processing": "import",
        "detail": {**DetailPolicy.everything().to_json(), "iterations": iterations},
        "snapshot": {
            "device": history.device, "entries": history.entries_read, "timed": history.timed,
            "initial_allocated_bytes": sum(b.size for b in history.initial),
            "initial_reserved_bytes": history.initial_reserved_bytes,
            "end_allocated_bytes": history.end_allocated_bytes, "end_reserved_bytes": history.end_reserved_bytes,
            "repairs": dict(history.repairs), "allocator_settings": settings,
        },
    }
