"""Attribution against allocator truth, per zoo model.

For each model one training step's memory is measured twice, independently: by ``torch.profiler``
(its own memory events, summed) and by memprof. The table gives the peak each reports (above the
memory live when the step began), their difference, and how far memprof's categories are from the
allocated total at any event. Run ``python -m benchmarks.bench_attribution``.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from memprof import MemoryProfiler, load_trace, zoo
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


def measure(name: str, batch_size: int = 16) -> dict[str, object]:
    """Peak of one step by torch.profiler and by memprof, and memprof's largest category-sum gap."""
    torch.manual_seed(0)
    model, make_batch = zoo.ZOO[name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = make_batch(batch_size)

    def step() -> None:
        torch.manual_seed(1)  # same dropout masks, same allocations
        zoo.train_step(model, optimizer, batch, set_to_none=False)

    step()
    truth = _torch_profiler_peak(step)
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryProfiler(model, optimizer, out_dir=tmp, print_period=0) as prof:
            step()
            prof.record_stats()
        trace = load_trace(prof.run_dir)
        events = trace.events
        start = int(events[events.event == "start"].allocated_bytes.iloc[0])
        peak = int(trace.iterations.peak_allocated_bytes.iloc[0]) - start
        gap = int((events[list(CATEGORY_COLUMNS)].sum(axis=1) - events.allocated_bytes).abs().max())
        at_peak = trace.iterations.iloc[0]
        dominant = max(CATEGORY_COLUMNS, key=lambda c: int(at_peak[c]))
    return {"model": name, "torch_profiler_peak": truth, "memprof_peak": peak, "gap": gap, "dominant": dominant,
            "peak_total": int(at_peak.peak_allocated_bytes)}


def table(rows: list[dict[str, object]]) -> str:
    """The Markdown table of :func:`measure` rows."""
    lines = ["| model | step peak, torch.profiler | step peak, memprof | difference | max |categories - allocated| | largest category at peak |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        diff = int(r["memprof_peak"]) - int(r["torch_profiler_peak"])
        pct = 100 * diff / max(int(r["torch_profiler_peak"]), 1)
        lines.append(f"| {r['model']} | {format_bytes(int(r['torch_profiler_peak']))} | {format_bytes(int(r['memprof_peak']))} "
                     f"| {diff} B ({pct:+.2f}%) | {r['gap']} B | {r['dominant']} |")
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
