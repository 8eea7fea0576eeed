"""The Planner view with recomputation options: what selective costs the dashboard against rotor.

Run ``python -m benchmarks.bench_options_view [--stages 100] [--options 3] [--moves 20]``.

For a random chain of ``--stages`` stages (``tests/planner/chain_strategies.py``), without options (the view
plans with rotor) and with ``--options`` options per stage (it plans with selective): the time to build the
planner model once (``dashboard.planning.model_of_chain``: the front's DP table, every algorithm's points,
the Pareto figure) and the server time of one slider move (read the schedule from the front, simulate it,
add the option columns, draw the schedule figure) at ``--moves`` budgets from the minimum to store-all.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import planner
from dashboard.figures_options import schedule_figure_with_options
from dashboard.planning import PlannerModel, model_of_chain, prediction_frame, with_option_columns
from tests.planner.chain_strategies import random_chain, random_option_chain


def _move_ms(model: PlannerModel, budget: int) -> float:
    started = time.perf_counter()
    schedule = model.front.schedule_at(budget)
    prediction = planner.simulate(model.chain, schedule)
    frame = with_option_columns(prediction_frame(prediction), prediction, model.chain)
    schedule_figure_with_options(frame, model.chain.module_names)
    return (time.perf_counter() - started) * 1e3


def measure(chain: planner.Chain, moves: int) -> tuple[str, float, float, float]:
    """``(algorithm, build s, median move ms, max move ms)`` for ``chain``."""
    started = time.perf_counter()
    model = model_of_chain(chain)
    build_s = time.perf_counter() - started
    low, high = model.min_budget_bytes, model.max_budget_bytes
    times = [_move_ms(model, low + (high - low) * i // max(moves - 1, 1)) for i in range(moves)]
    return model.algorithm, build_s, statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> int:
    """Measures both chains and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, default=100)
    parser.add_argument("--options", type=int, default=3)
    parser.add_argument("--moves", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"`python -m benchmarks.bench_options_view --stages {args.stages} --options {args.options} "
          f"--moves {args.moves}`\n")
    print("| chain | slider's DP | building the model | slider move, median | slider move, max |")
    print("| --- | --- | --- | --- | --- |")
    for label, chain in ((f"{args.stages} stages, no options", random_chain(1, args.stages)),
                         (f"{args.stages} stages, {args.options} options each",
                          random_option_chain(1, args.stages, args.options))):
        algorithm, build_s, median_ms, max_ms = measure(chain, args.moves)
        print(f"| {label} | {algorithm} | {build_s:.2f} s | {median_ms:.1f} ms | {max_ms:.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
