"""Regenerates the small recorded example under traces/example (shipped so the dashboard has a run to show)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from examples import zoo
from memprof import MemoryProfiler


def main() -> None:
    target = Path(__file__).resolve().parent.parent / "traces"
    shutil.rmtree(target / "example", ignore_errors=True)
    torch.manual_seed(0)
    model, make_batch = zoo.cnn(channels=16, blocks=4, image=32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=target, run_id="example", print_period=0) as profiler:
        for _ in range(4):
            zoo.train_step(model, optimizer, make_batch(16))
            profiler.record_stats()
    print(f"wrote {profiler.run_dir}")


if __name__ == "__main__":
    main()
