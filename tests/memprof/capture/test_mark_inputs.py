"""``MemoryProfiler.mark_inputs``: what the root's forward hook cannot see (targets only the loss reads) is
counted as the step's inputs; what it sees, by position or keyword, needs no marking."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from memprof import MemoryProfiler, load_trace


class _ByKeyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 10)

    def forward(self, *, features: torch.Tensor) -> torch.Tensor:
        return self.lin(features)


def _inputs_at_peak(tmp_path, mark: bool) -> tuple[int, int]:
    torch.manual_seed(0)
    model = _ByKeyword()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            features, targets = torch.randn(64, 32), torch.randint(0, 10, (64,))
            if mark:
                profiler.mark_inputs((features, targets))
            optimizer.zero_grad()
            F.cross_entropy(model(features=features), targets).backward()
            optimizer.step()
            del features, targets  # one batch alive at a time, as with a data loader
            profiler.record_stats()
    row = load_trace(profiler.run_dir).iterations.set_index("iteration").loc[1]
    return int(row.inputs), int(row.peak_allocated_bytes)


def test_marked_inputs_are_counted_as_inputs(tmp_path) -> None:
    batch_bytes = 64 * 32 * 4 + 64 * 8
    unmarked, peak = _inputs_at_peak(tmp_path / "a", mark=False)
    marked, marked_peak = _inputs_at_peak(tmp_path / "b", mark=True)
    assert unmarked == 64 * 32 * 4  # features by keyword: the root's hook sees them; targets only the loss reads
    assert marked == batch_bytes and marked_peak == peak  # the same bytes, now in their category
