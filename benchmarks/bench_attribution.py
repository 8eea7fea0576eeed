"""Attribution against allocator truth, per zoo model.

For each model one training step's memory is measured twice, independently: by ``torch.profiler``
(its own memory events, summed) and by memprof. The table gives the peak each reports (above the
memory live when the step began), their difference, and memprof's feature maps when the forward returns
against what autograd itself saved (its ``saved_tensors_hooks``, plus the model's output): the category that
dominates most peaks, held against a record memprof does not make. (The column this replaced, the gap
between the categories' sum and ``allocated_bytes``, was 0 by construction: one is defined as the other.)
Run ``python -m benchmarks.bench_attribution``.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.categories import CATEGORY_COLUMNS
from memprof.units import format_bytes


def _torch_profiler_peak(step) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes = [e.nbytes() for e in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                                        key=lambda e: e.start_ns())]
    running = peak = 0
    for size in sizes:
        running += size
        peak = max(peak, running)
    return peak


def _autograd_saved_bytes(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Distinct storages autograd saves in a forward (parameters, buffers and the input excluded), plus the output."""
    excluded = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), inputs)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(inputs)
    saved[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    return sum(saved.values())


def measure(name: str, batch_size: int = 16) -> dict[str, object]:
    """Peak of one step by torch.profiler and by memprof; feature maps by memprof and by autograd's own hooks."""
    torch.manual_seed(0)
    model, make_batch = zoo.ZOO[name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = make_batch(batch_size)

    def step() -> None:
        torch.manual_seed(1)  # same dropout masks, same allocations
        zoo.train_step(model, optimizer, batch, set_to_none=False)

    step()
    truth = _torch_profiler_peak(step)
    torch.manual_seed(1)
    saved = _autograd_saved_bytes(model, batch[0])
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryProfiler(model, optimizer, out_dir=tmp, print_period=0) as prof:
            step()
            prof.record_stats()
        trace = load_trace(prof.run_dir)
        events = trace.events
        start = int(events[events.event == "start"].allocated_bytes.iloc[0])
        peak = int(trace.iterations.peak_allocated_bytes.iloc[0]) - start
        exit_row = events[(events.module == "") & (events.phase == "forward") & (events.event == "exit")].iloc[0]
        feature_maps = int(exit_row.feature_maps)
        at_peak = trace.iterations.iloc[0]
        dominant = max(CATEGORY_COLUMNS, key=lambda c: int(at_peak[c]))
    return {"model": name, "torch_profiler_peak": truth, "memprof_peak": peak, "feature_maps": feature_maps,
            "autograd_saved": saved, "dominant": dominant, "peak_total": int(at_peak.peak_allocated_bytes)}


def table(rows: list[dict[str, object]]) -> str:
    """The Markdown table of :func:`measure` rows."""
    lines = ["| model | step peak, torch.profiler | step peak, memprof | difference "
             "| feature maps at forward's end, memprof - autograd's saved tensors | largest category at peak |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        diff = int(r["memprof_peak"]) - int(r["torch_profiler_peak"])
        pct = 100 * diff / max(int(r["torch_profiler_peak"]), 1)
        lines.append(f"| {r['model']} | {format_bytes(int(r['torch_profiler_peak']))} | {format_bytes(int(r['memprof_peak']))} "
                     f"| {diff} B ({pct:+.2f}%) | {int(r['feature_maps']) - int(r['autograd_saved'])} B "
                     f"(of {format_bytes(int(r['autograd_saved']))}) | {r['dominant']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Runs the benchmark and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(zoo.ZOO))
    args = parser.parse_args(argv)
    text = table([measure(name) for name in args.models])
    print(text)
    return text


if __name__ == "__main__":
    main()
