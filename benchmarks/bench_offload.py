"""Offload against rotor (recompute only) on an 8-layer Llama, predicted at the documented default bandwidth.

Run ``python -m benchmarks.bench_offload`` (``--help`` for options). A ``transformers`` LlamaForCausalLM
(hidden 512, 8 layers, 8 heads, sequence 256, batch 4, eager attention, fp32) is profiled on this machine
for a few steps; its chain (``model.layers.0..7``; sizes measured, device-independent) is solved
activations-only (budgets and peaks are the chain's own memory, the ROTOR paper's M, without the model and
optimizer state both algorithms share) with the default link, 24 GB/s each way
(:data:`planner.model.transfer.DEFAULT_TRANSFER`). Nothing here runs on a GPU: every number is the simulator's.

Whether offloading pays depends on how long a layer computes against how long its saved activations take to
cross the link, so the chain is solved with its measured CPU times and with those times divided by 10, 100
and 1000 (the implied throughput column puts each against real devices: an H100 runs these fp32 matmuls at
tens of TFLOP/s). For each speed: rotor and offload at six budgets from rotor's minimum to store-all's peak,
and the peak at equal step time -- for each rotor budget, the lowest offload peak whose makespan is at most
rotor's there, found over ``--grid`` budgets -- as a reduction of rotor's peak. Solve times are medians of
``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from memprof import MemoryProfiler, load_trace
from memprof.units import format_bytes
from planner import chain_from_trace
from planner.errors import InfeasibleBudgetError
from planner.model.chain import Chain
from planner.solvers.dispatch import min_feasible_budget, solve, store_all_budget

HIDDEN, INTERMEDIATE, LAYERS, HEADS, SEQ, BATCH, VOCAB = 512, 1376, 8, 8, 256, 4, 1024


def profiled_chain(steps: int, batch: int = BATCH, optimizer: str = "sgd") -> Chain:
    """The Llama's chain from a profiled run on this machine, with the whole step's costs (``"sgd"`` or
    ``"adamw"``: the optimizer trained with, whose state the step holds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         max_position_embeddings=SEQ, use_cache=False, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    model.train()
    trainer = (torch.optim.AdamW(model.parameters(), lr=1e-4) if optimizer == "adamw"
               else torch.optim.SGD(model.parameters(), lr=1e-3))
    with tempfile.TemporaryDirectory() as folder:
        with MemoryProfiler(model, trainer, out_dir=Path(folder), print_period=0) as profiler:
            for _ in range(steps):
                ids = torch.randint(0, VOCAB, (batch, SEQ))
                trainer.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
                trainer.step()
                profiler.record_stats()
        return chain_from_trace(load_trace(profiler.run_dir), container="model.layers")


def layer_flops() -> float:
    """Forward FLOPs of one decoder layer: 2 per multiply-add of its matmuls, attention scores and mixing."""
    tokens = BATCH * SEQ
    weights = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE
    return 2.0 * tokens * weights + 4.0 * BATCH * SEQ * SEQ * HIDDEN


def scaled(chain: Chain, factor: float) -> Chain:
    """``chain`` with every time divided by ``factor`` (a device ``factor`` times faster at computing)."""
    stages = tuple(replace(s, forward_ms=s.forward_ms / factor, backward_ms=s.backward_ms / factor)
                   for s in chain.stages)
    return replace(chain, stages=stages)


def _solve(chain: Chain, budget: int, algorithm: str) -> tuple[int, float, int, int] | None:
    """``(peak, makespan, host peak, stages offloaded)`` of ``algorithm`` at ``budget``, or ``None``."""
    try:
        schedule = solve(chain, budget, algorithm)
    except InfeasibleBudgetError:
        return None
    offloaded = len(schedule.params.offloaded or ())
    return int(schedule.predicted_peak_bytes or 0), float(schedule.predicted_makespan_ms or 0.0), \
        int(schedule.predicted_host_peak_bytes or 0), offloaded


Solved = tuple[int, float, int, int]  # peak, makespan, host peak, stages offloaded


def compare(chain: Chain, grid: int) -> list[tuple[int, Solved, Solved, int]]:
    """``(budget, rotor, offload, offload's lowest peak at rotor's step time)`` at six budgets."""
    low, top = min_feasible_budget(chain, "rotor"), store_all_budget(chain)
    lowest = min_feasible_budget(chain, "offload")
    sweep = [(budget, _solve(chain, int(budget), "offload"))
             for budget in np.unique(np.linspace(lowest, top, grid).astype(np.int64))]
    rows = []
    for budget in np.unique(np.linspace(low, top, 6).astype(np.int64)):
        rotor, offload = _solve(chain, int(budget), "rotor"), _solve(chain, int(budget), "offload")
        assert rotor is not None and offload is not None
        fitting = [found[0] for _, found in sweep if found is not None and found[1] <= rotor[1] + 1e-9]
        equal_time_peak = min(fitting + [offload[0]] if offload[1] <= rotor[1] + 1e-9 else fitting)
        rows.append((int(budget), rotor, offload, equal_time_peak))
    return rows


def solve_seconds(chain: Chain, algorithm: str, repeats: int) -> float:
    """Median wall seconds of one ``solve`` halfway between rotor's minimum and store-all's peak."""
    budget = (min_feasible_budget(chain, "rotor") + store_all_budget(chain)) // 2
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        solve(chain, budget, algorithm)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Profiles the Llama, solves it at four compute speeds, prints the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_offload", description=__doc__)
    parser.add_argument("--steps", type=int, default=4, help="profiled training steps")
    parser.add_argument("--grid", type=int, default=60, help="offload budgets searched for equal step time")
    parser.add_argument("--repeats", type=int, default=5, help="runs per solve-time measurement")
    args = parser.parse_args(argv)
    chain = profiled_chain(args.steps).activations_only()
    layers = chain.stages[:-1]
    link = chain.transfer_costs
    copy_ms = statistics.median(link.d2h_ms(chain.offload_bytes(i)) for i in range(1, chain.length + 1))
    forward_ms = statistics.median(s.forward_ms for s in layers)
    print(f"Chain: {chain.length} stages ({layers[0].name} .. {layers[-1].name}) + loss; per layer a = "
          f"{format_bytes(layers[0].output_bytes)}, a-bar = {format_bytes(layers[0].saved_bytes)} "
          f"(median over layers: forward {forward_ms:.2f} ms, backward "
          f"{statistics.median(s.backward_ms for s in layers):.2f} ms on this CPU); link {link.describe()}: "
          f"a-bar - a crosses it in {copy_ms:.2f} ms each way. Store-all peak {format_bytes(store_all_budget(chain))}.")
    print()
    print("| compute speed | implied throughput | budget | rotor peak | rotor time | offload peak | offload time | "
          "host peak | stages offloaded | offload peak at rotor's time | lower by |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    best: dict[float, float] = {}
    for factor in (1.0, 10.0, 100.0, 1000.0):
        fast = scaled(chain, factor)
        throughput = layer_flops() / (forward_ms / factor * 1e-3) / 1e12
        for budget, rotor, offload, equal in compare(fast, args.grid):
            lower = 1 - equal / rotor[0]
            best[factor] = max(best.get(factor, 0.0), lower)
            print(f"| CPU / {factor:g} | {throughput:.2f} TFLOP/s | {format_bytes(budget)} | "
                  f"{format_bytes(rotor[0])} | {rotor[1]:.2f} ms | {format_bytes(offload[0])} | {offload[1]:.2f} ms | "
                  f"{format_bytes(offload[2])} | {offload[3]} | {format_bytes(equal)} | {lower:.0%} |")
    print()
    print("Largest reduction of the peak at equal step time, per compute speed: "
          + ", ".join(f"CPU / {factor:g}: {value:.0%}" for factor, value in best.items()) + ".")
    print()
    print(f"Solve time (median of {args.repeats}, one budget, 500 slots, measured CPU times): rotor "
          f"{solve_seconds(chain, 'rotor', args.repeats) * 1e3:.0f} ms, offload "
          f"{solve_seconds(chain, 'offload', args.repeats) * 1e3:.0f} ms.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
