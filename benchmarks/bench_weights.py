"""Weight streaming against rotor (recompute only) and activation offload on an 8-layer Llama, predicted.

Run ``python -m benchmarks.bench_weights`` (``--help`` for options). The Llama of ``bench_offload``
(``transformers`` LlamaForCausalLM, hidden 512, 8 layers, 8 heads, sequence 256, batch 4, eager attention,
fp32) is profiled on this machine for a few steps, trained with AdamW (two fp32 moments per parameter, the
usual optimizer for such a model). Its chain (``model.layers.0..7``) is solved with the whole step counted
-- budgets and peaks are the step's: weights, gradients, optimizer state, batch, activations -- at the
documented default link, 24 GB/s each way (:data:`planner.model.transfer.DEFAULT_TRANSFER`). Nothing here runs on
a GPU: every number is the simulator's.

The chain is solved with its measured CPU times, and with those times scaled to a layer throughput of 1, 10
and 50 TFLOP/s (a faster device: an H100 runs fp32 at about 60 TFLOP/s without tensor cores; the speeds are
fixed throughputs rather than fixed factors, so the table does not move with this machine's load). Streaming a layer's
weights costs nothing while they cross the link faster than the layer before it computes, so what decides is
the tokens per step (``--batch``): compute grows with them, the weights do not. For each speed, at
six budgets from rotor's minimum to store-all's step peak: rotor's step peak and step time, and the lowest
step peak that activation offload (``solve(..., "offload")``) and weight streaming with activation offload
(``solve(..., "offload", stream_weights=True)``) reach at a step time no longer than rotor's there (found
over ``--grid`` budgets each), as a reduction of rotor's peak.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.bench_offload import (
    BATCH,
    SEQ,
    layer_flops,
    profiled_chain,
    scaled,
)
from memprof.units import format_bytes
from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget

TARGETS_TFLOPS = (1.0, 10.0, 50.0)
"""Compute speeds the chain is also solved at, besides this CPU's: its times scaled to these layer throughputs."""

Solved = tuple[int, float, int, int]  # step peak, makespan, host peak, stages streamed


def _solve(chain: Chain, budget: int, algorithm: str, stream: bool = False) -> Solved | None:
    try:
        schedule = solve(chain, budget, algorithm, stream_weights=stream)
    except InfeasibleBudgetError:
        return None
    return (int(schedule.predicted_step_peak_bytes or 0), float(schedule.predicted_makespan_ms or 0.0),
            int(schedule.predicted_host_peak_bytes or 0), len(schedule.streamed_weights))


def sweep(chain: Chain, grid: int, stream: bool) -> list[Solved]:
    """``offload`` (with weight streaming when ``stream``) at ``grid`` budgets from its minimum to store-all's."""
    low, top = min_feasible_budget(chain, "offload", stream_weights=stream), store_all_budget(chain)
    found = [_solve(chain, int(b), "offload", stream) for b in np.unique(np.linspace(low, top, grid).astype(np.int64))]
    return [f for f in found if f is not None]


def lowest_at(solved: list[Solved], makespan_ms: float) -> Solved | None:
    """The lowest step peak among ``solved`` no slower than ``makespan_ms``."""
    fitting = [s for s in solved if s[1] <= makespan_ms + 1e-9]
    return min(fitting, key=lambda s: (s[0], s[1])) if fitting else None


def compare(chain: Chain, grid: int) -> list[tuple[int, Solved, Solved | None, Solved | None]]:
    """``(budget, rotor, offload at rotor's time, streaming at rotor's time)`` at six rotor budgets.

    Each "at rotor's time" is the lowest step peak no slower than rotor there, over the ``grid`` budgets of
    the sweep and the rotor budget itself.
    """
    offloads, streams = sweep(chain, grid, False), sweep(chain, grid, True)
    rows = []
    for budget in np.unique(np.linspace(min_feasible_budget(chain, "rotor"), store_all_budget(chain), 6).astype(np.int64)):
        rotor = _solve(chain, int(budget), "rotor")
        assert rotor is not None
        here = [found for found in (_solve(chain, int(budget), "offload"),) if found is not None]
        here_streamed = [found for found in (_solve(chain, int(budget), "offload", True),) if found is not None]
        rows.append((int(budget), rotor, lowest_at(offloads + here, rotor[1]),
                     lowest_at(streams + here_streamed, rotor[1])))
    return rows


def _cell(found: Solved | None, rotor: Solved) -> tuple[str, str]:
    if found is None:
        return "none", "-"
    lower = 1 - found[0] / rotor[0]
    return format_bytes(found[0]), f"{0.0 if abs(lower) < 0.005 else lower:.0%}"


def report(chain: Chain, batch: int, grid: int) -> None:
    """Prints the chain's costs and the table at four compute speeds."""
    assert chain.weights is not None and chain.step is not None
    layers = chain.stages[:-1]
    link, weights = chain.transfer_costs, chain.weights
    forward_ms = statistics.median(s.forward_ms for s in layers)
    print(f"**Batch {batch} x {SEQ} tokens.** Chain: {chain.length} stages ({layers[0].name} .. {layers[-1].name}) "
          f"+ loss. Per layer: parameters {format_bytes(weights.param_bytes[0])} (cross the link in "
          f"{link.h2d_ms(weights.param_bytes[0]):.2f} ms), optimizer state "
          f"{format_bytes(weights.optimizer_state_bytes[0])}, a-bar {format_bytes(layers[0].saved_bytes)}; median "
          f"forward {forward_ms:.2f} ms, backward {statistics.median(s.backward_ms for s in layers):.2f} ms on this "
          f"CPU. Step: model state {format_bytes(chain.step.model_state_bytes)}, store-all step peak "
          f"{format_bytes(store_all_budget(chain))}; link {link.describe()}.")
    print()
    print("| compute speed | implied throughput | rotor budget | rotor step peak | rotor step time | offload peak at "
          "rotor's time | lower by | streaming peak at rotor's time | lower by | stages streamed | host peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    best: dict[float, tuple[float, float]] = {}
    measured = layer_flops() * batch / BATCH / (forward_ms * 1e-3) / 1e12  # TFLOP/s of this CPU's forwards
    for factor in (1.0, *(target / measured for target in TARGETS_TFLOPS)):
        fast = scaled(chain, factor)
        throughput = measured * factor
        for budget, rotor, offload, stream in compare(fast, grid):
            off_peak, off_lower = _cell(offload, rotor)
            str_peak, str_lower = _cell(stream, rotor)
            gains = tuple(0.0 if f is None else 1 - f[0] / rotor[0] for f in (offload, stream))
            previous = best.get(factor, (0.0, 0.0))
            best[factor] = (max(previous[0], gains[0]), max(previous[1], gains[1]))
            speed = "this CPU" if factor == 1.0 else f"CPU x {factor:.3g}"
            print(f"| {speed} | {throughput:.2f} TFLOP/s | {format_bytes(budget)} | {format_bytes(rotor[0])} | "
                  f"{rotor[1]:.2f} ms | {off_peak} | {off_lower} | {str_peak} | {str_lower} | "
                  f"{stream[3] if stream else '-'} | {format_bytes(stream[2]) if stream else '-'} |")
    print()
    print(f"Batch {batch}: largest reduction of the step peak at rotor's step time, per compute speed (offload; "
          "streaming): " + ", ".join(f"{measured * f:.2f} TFLOP/s: {a:.0%}; {b:.0%}" for f, (a, b) in best.items())
          + ".")
    print()


def main(argv: list[str] | None = None) -> int:
    """Profiles the Llama at each batch size, solves it at four compute speeds, prints the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_weights", description=__doc__)
    parser.add_argument("--steps", type=int, default=4, help="profiled training steps")
    parser.add_argument("--grid", type=int, default=40, help="budgets searched for equal step time")
    parser.add_argument("--batch", type=int, nargs="+", default=[BATCH, 4 * BATCH],
                        help=f"sequences per step, one table each (default {BATCH} {4 * BATCH})")
    args = parser.parse_args(argv)
    for batch in args.batch:
        chain = profiled_chain(args.steps, batch, optimizer="adamw")
        started = time.perf_counter()
        report(chain, batch, args.grid)
        print(f"Solving the batch-{batch} table took {time.perf_counter() - started:.0f} s.")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
