"""Estimates on fake tensors against the allocator's measured step peak, and the time an estimate takes.

Table 1: every model of ``tests/memprof/estimation/cases.py`` (the zoo's MLP, CNN, GPT-style and Llama-style
models; Hugging Face GPT-2, BERT and Llama from small configs; a model with in-place ops, views and tied
weights) with AdamW: the estimated step peak (``memprof.estimate``, the second of two steps) beside the
measured one (torch.profiler's allocator events over a real CPU step, the baseline), the error, the worst
error over all six optimizers (SGD with momentum, Adam, AdamW; foreach and not), and the median time of an
estimate beside the median time of the real step it predicts.

Table 2: Hugging Face GPT-2 configs up to GPT-2 large (36 layers, 1280 wide, 20 heads: 774M parameters) built
on the meta device, AdamW, batch 1 x 1024 tokens: the time of an estimate (median), its step peak, and
the real memory it used: the CPU allocator's peak during the estimate (torch.profiler, in a separate run,
where the CPU kernels' workspace probes are left out) and the growth of the process's peak RSS over the
estimates (each config in a fresh process, measured after the model is built on the meta device).

Run ``python -m benchmarks.bench_estimate [--repeats 3] [--skip-large]``.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from memprof import estimate
from memprof.units import format_bytes
from tests.allocator_truth import allocator_rise_bytes
from tests.memprof.estimation.cases import CASES, OPTIMIZERS, measured_peak, train_step

GPT2_SIZES = {"gpt2 (124M)": (12, 768, 12), "gpt2-medium (355M)": (24, 1024, 16), "gpt2-large (774M)": (36, 1280, 20)}


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _step_seconds(name: str, repeats: int) -> float:
    model, batch, loss_fn = CASES[name].build()
    optimizer = OPTIMIZERS["adamw"](list(model.parameters()))
    train_step(model, batch, loss_fn, optimizer)
    return _median_seconds(lambda: train_step(model, batch, loss_fn, optimizer), repeats)


def accuracy_table(repeats: int, out: Path) -> str:
    lines = ["| model | params | estimated step peak | measured step peak | error (AdamW) | "
             "largest error, 6 optimizers | estimate s | real step s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, case in CASES.items():
        errors: dict[str, float] = {}
        shown = (0, 0)
        for optimizer in OPTIMIZERS:
            model, batch, loss_fn = case.build()
            predicted = estimate(model, batch, loss_fn, OPTIMIZERS[optimizer], out_dir=out).peak_bytes
            model, batch, loss_fn = case.build()
            measured = measured_peak(model, batch, loss_fn, OPTIMIZERS[optimizer])
            errors[optimizer] = (predicted - measured) / measured
            if optimizer == "adamw":
                shown = (predicted, measured)
        model, batch, loss_fn = case.build()
        params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        seconds = _median_seconds(
            lambda m=model, b=batch, f=loss_fn: estimate(m, b, f, OPTIMIZERS["adamw"], out_dir=out), repeats)
        worst = max(errors, key=lambda o: abs(errors[o]))
        lines.append(f"| {name} | {params / 1e6:.2f}M | {format_bytes(shown[0])} | {format_bytes(shown[1])} | "
                     f"{shown[0] - shown[1]:+d} B ({100 * errors['adamw']:+.4f}%) | "
                     f"{100 * errors[worst]:+.4f}% ({worst}) | {seconds:.2f} | {_step_seconds(name, repeats):.3f} |")
    return "\n".join(lines)


def _gpt2(layers: int, width: int, heads: int) -> tuple:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, use_cache=False, attn_implementation="eager")
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    ids = torch.empty(1, 1024, dtype=torch.long, device="meta")
    return model, (ids,), lambda m, b: m(input_ids=b[0], labels=b[0]).loss


def _allocator_peak_during(call) -> int:
    # the workspace probes step aside for the profiler, and say so
    return allocator_rise_bytes(call, quiet=True)


def _peak_rss() -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1)) * 1024  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_rss_reset() -> int:
    """Resets the peak resident memory to the current one where Linux allows it; returns it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        pass  # the peak then starts from the process's earlier high-water mark
    return _peak_rss()


def _one_large(label: str, repeats: int) -> dict[str, float]:
    """One GPT-2 config, in this (fresh) process: times, peaks and the real memory the estimate used."""
    model, batch, loss_fn = _gpt2(*GPT2_SIZES[label])
    adamw = OPTIMIZERS["adamw"]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        rss_before = _peak_rss_reset()
        found = []
        seconds = _median_seconds(lambda: found.append(estimate(model, batch, loss_fn, adamw, out_dir=out)), repeats)
        rss_growth = _peak_rss() - rss_before
        cuda = estimate(model, batch, loss_fn, adamw, device="cuda", out_dir=out)
        real = _allocator_peak_during(lambda: estimate(model, batch, loss_fn, adamw, out_dir=out))
    return {"params": sum(p.numel() for p in model.parameters()), "seconds": seconds,
            "peak": found[-1].peak_bytes, "reserved": cuda.reserved_peak_bytes or 0, "real": real,
            "rss_growth": max(rss_growth, 0)}


def large_table(repeats: int) -> str:
    lines = ["| config | params | weights (fp32) | estimate s (median) | estimated step peak | reserved on CUDA | "
             "real allocator peak during the estimate | peak RSS growth of the process |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label in GPT2_SIZES:  # each in a fresh process, so that its peak RSS is its own
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_estimate", "--one-large", label,
                               "--repeats", str(repeats)], capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        lines.append(f"| {label} | {row['params'] / 1e6:.0f}M | {format_bytes(int(row['params']) * 4)} | "
                     f"{row['seconds']:.1f} | {format_bytes(int(row['peak']))} | {format_bytes(int(row['reserved']))} | "
                     f"{format_bytes(int(row['real']))} | {format_bytes(int(row['rss_growth']))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_estimate", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true", help="leave out the GPT-2 configs (table 2)")
    parser.add_argument("--one-large", choices=list(GPT2_SIZES), help=argparse.SUPPRESS)  # a child of table 2
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", module="transformers")
    if args.one_large:
        print(json.dumps(_one_large(args.one_large, args.repeats)))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        print("### Estimated vs measured step peak (CPU; batch sizes of the tests)\n")
        print(accuracy_table(args.repeats, out))
        if not args.skip_large:
            print("\n### GPT-2 configs on the meta device, AdamW, batch 1 x 1024 tokens\n")
            print(large_table(args.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
