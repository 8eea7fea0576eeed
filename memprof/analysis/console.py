"""The periodic console table (the seed profiler's report, with honest units)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memprof.categories import CATEGORY_COLUMNS, Category
from memprof.units import format_bytes

#: Keys of an iterations row that :func:`format_report` reads where given (no columns of the trace: the training
#: process's report has them, :func:`memprof.analysis.timeline.peak_notes`): whether the peak came after the model's
#: forward returned and before its backward (the loss), and the previous step's weight gradients alive at the peak.
AFTER_FORWARD_KEY = "peak_after_forward"
EARLIER_GRADS_KEY = "peak_earlier_grad_bytes"
#: Categories only autocast, FSDP or DDP fill: the report lists them when they hold bytes.
_WHEN_USED = frozenset({Category.WEIGHT_COPIES.value, Category.COMM_BUFFERS.value})


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return out


def format_report(iteration: Mapping[str, Any], layers: Sequence[Mapping[str, Any]], device: str,
                  top: int = 8) -> str:
    """Renders one iteration's summary: peak and current memory, categories at the peak, top layers.

    Args:
        iteration: a row of the iterations table.
        layers: rows of the layers table for the same iteration.
        device: the profiled device, shown in the title.
        top: how many layers to list (largest feature maps plus weights first).
    """
    it = iteration
    lines = [
        f"memprof | iteration {it['iteration']} (epoch {it['epoch']}) on {device} | step {float(it['step_ms']):.1f} ms",
        f"  peak allocated {format_bytes(int(it['peak_allocated_bytes']))} during {it['peak_phase']}"
        + (f" in '{it['peak_module']}'" if it["peak_module"] else "")
        + (", after the model's forward returned (the loss)" if it.get(AFTER_FORWARD_KEY) else "")
        + f" | current {format_bytes(int(it['allocated_bytes']))}",
    ]
    earlier = int(it.get(EARLIER_GRADS_KEY, 0) or 0)
    if earlier:  # Lightning's loop: training_step, then zero_grad, then backward
        lines.append(f"  previous step's weight gradients alive at the peak: {format_bytes(earlier)} "
                     "(zero_grad runs after the forward, as in Lightning's loop)")
    micro = int(it.get("micro_batches", 1) or 1)
    if micro > 1:  # gradient accumulation: say what the layer rows below are
        lines.append(f"  {micro} micro-batches (gradient accumulation): the peak is the whole step's; layers "
                     "show one micro-batch's calls (the last)")
    if int(it.get("peak_reserved_bytes", 0) or 0) > 0:
        cache = int(it["peak_reserved_bytes"]) - int(it["peak_allocated_bytes"])
        lines.append(f"  peak reserved {format_bytes(int(it['peak_reserved_bytes']))} (cache {format_bytes(cache)})")
    peak = max(int(it["peak_allocated_bytes"]), 1)
    cat_rows = [[name, format_bytes(int(it.get(name, 0))), f"{100 * int(it.get(name, 0)) / peak:.1f}%"]
                for name in CATEGORY_COLUMNS if name not in _WHEN_USED or int(it.get(name, 0))]
    lines += ["", *("  " + x for x in _table(["category at peak", "bytes", "share"], cat_rows))]
    leaves = [r for r in layers if r["module"] != ""]
    leaves.sort(key=lambda r: int(r["feature_map_bytes"]) + int(r["weight_bytes"]), reverse=True)
    layer_rows = [
        [str(r["module"])[:40], str(r["kind"]), format_bytes(int(r["weight_bytes"])),
         format_bytes(int(r["weight_grad_bytes"])), format_bytes(int(r["feature_map_bytes"])),
         f"{float(r['forward_ms']):.2f}", f"{float(r['backward_ms']):.2f}"]
        for r in leaves[:top]
    ]
    if layer_rows:
        lines += ["", *("  " + x for x in _table(
            ["layer", "kind", "weights", "weight grads", "feature maps", "fwd ms", "bwd ms"], layer_rows))]
    return "\n".join(lines)


def format_failure(failure: Mapping[str, Any]) -> str:
    """Renders the post-mortem stored in ``meta.json`` when a step ran out of memory."""
    categories = failure.get("categories") or {}
    lines = [
        "",
        f"FAILED in iteration {failure.get('iteration')}: {failure.get('message', '')}",
        f"  running: module '{failure.get('module', '')}' during {failure.get('phase', '?')} "
        f"(last event: {failure.get('last_event', '?')})",
        f"  allocated: {format_bytes(int(failure.get('allocated_bytes') or 0))}"
        + (f" (budget {format_bytes(int(failure['budget_bytes']))})" if failure.get("budget_bytes") else ""),
        "  what filled memory: " + ", ".join(
            f"{name} {format_bytes(int(value))}" for name, value in categories.items() if int(value) > 0),
    ]
    holders = failure.get("top_feature_maps") or []
    if holders:
        lines.append("  largest feature maps: " + ", ".join(
            f"{h['module']} ({h['kind']}) {format_bytes(int(h['feature_map_bytes']))}" for h in holders))
    return "\n".join(lines)
