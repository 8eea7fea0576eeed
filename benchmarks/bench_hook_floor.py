"""What Python hooks cost the training thread by being there, whatever they do (issue 35).

Run ``python -m benchmarks.bench_hook_floor [--models transformer,mlp,cnn] [--pairs 80]``. On one of the profiler
benchmark's models, at 1 intra-op thread, steps alternate between four settings and each step's CPU time on the
training thread (``time.thread_time``) is taken:

- **bare**: no hook;
- **empty hooks**: a forward pre- and post-hook that do nothing on every module, and a post-accumulate-grad hook
  that does nothing on every parameter;
- **+ node pre-hooks**: the same, the post-hook registering a pre-hook that does nothing on its output's autograd
  node (how memprof marks a module's backward);
- **memprof's hooks**: :class:`memprof.capture.hooks.HookRecorder` with every hook on, its lists drained per step.

The medians' differences from the bare step are the floor any per-module-call Python pays, which is why steady
iterations (:mod:`memprof.capture.steady`) take those hooks off rather than trim them further.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.bench_profiler import MODELS, ModelSpec
from examples import zoo
from memprof.capture.hooks import HookRecorder

SETTINGS = ("bare", "empty hooks", "+ node pre-hooks", "memprof's hooks")


def _empty(model: nn.Module, on_output: Callable[[Any], None] | None) -> list[Any]:
    def post(module: nn.Module, args: Any, output: Any) -> None:
        if on_output is not None:
            on_output(output)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda module, args: None))
        handles.append(module.register_forward_hook(post))
    handles.extend(p.register_post_accumulate_grad_hook(lambda p: None) for p in model.parameters())
    return handles


def _node_pre_hook(output: Any) -> None:
    if isinstance(output, torch.Tensor) and output.grad_fn is not None:
        output.grad_fn.register_prehook(lambda grads: None)


def measure(spec: ModelSpec, pairs: int) -> dict[str, list[float]]:
    """CPU ms of the training thread per step, by setting, the settings alternating step by step."""
    torch.manual_seed(0)
    model, make_batch = spec.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = make_batch(spec.batch_size)

    def step() -> float:
        start = time.thread_time()
        zoo.train_step(model, optimizer, batch)
        return (time.thread_time() - start) * 1e3

    for _ in range(10):
        step()
    found: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(pairs):
        for name in SETTINGS:
            handles: list[Any] = []
            recorder = None
            if name == "empty hooks":
                handles = _empty(model, None)
            elif name == "+ node pre-hooks":
                handles = _empty(model, _node_pre_hook)
            elif name == "memprof's hooks":
                recorder = HookRecorder(list(model.modules()), list(model.parameters()), optimizer)
                recorder.attach()
            step()  # the hooks' first step (their objects made) is not counted
            found[name].append(step())
            for handle in handles:
                handle.remove()
            if recorder is not None:
                recorder.drain()
                recorder.detach()
    return found


def table(results: dict[str, dict[str, list[float]]]) -> list[str]:
    """Median CPU ms per step by setting, and its difference from the bare step's."""
    lines = ["| Model | " + " | ".join(SETTINGS) + " |", "|---|" + "---:|" * len(SETTINGS)]
    for model, found in results.items():
        bare = statistics.median(found["bare"])
        cells = [f"{bare:.2f} ms"] + [f"+{statistics.median(found[name]) - bare:.2f} ms" for name in SETTINGS[1:]]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Measures the chosen models and prints a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,mlp,cnn", help="comma-separated subset of: "
                        + ", ".join(m.name for m in MODELS))
    parser.add_argument("--pairs", type=int, default=80, help="steps per setting, alternating")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    wanted = args.models.split(",")
    results = {spec.name: measure(spec, args.pairs) for spec in MODELS if spec.name in wanted}
    print(f"Training thread's CPU per step, median of {args.pairs} steps per setting, 1 intra-op thread; "
          f"`python -m benchmarks.bench_hook_floor --models {args.models} --pairs {args.pairs}`\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
