"""On a GPU: the CUDA estimate against the caching allocator's own counters (skipped without CUDA).

The measured peak is ``torch.cuda.max_memory_allocated()`` over a steady-state step, less what was allocated
before the step that is not the model's, the optimizer's or the batch's (cuBLAS's workspace, which the
estimate does not model: it runs no kernel).
"""

from __future__ import annotations

import pytest
import torch

from memprof import estimate
from memprof.estimation.cuda_allocator import round_size
from tests.memprof.estimation.cases import CASES, train_step

pytestmark = pytest.mark.gpu


def _adamw(params):
    return torch.optim.AdamW(params, foreach=True)


def _to_cuda(batch):
    if isinstance(batch, torch.Tensor):
        return batch.cuda()
    return type(batch)(_to_cuda(b) for b in batch)


def _blocks(tensors) -> int:
    found = {t.untyped_storage().data_ptr(): round_size(t.untyped_storage().nbytes()) for t in tensors}
    return sum(found.values())


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt2"])
def test_the_cuda_estimate_is_within_3_percent_of_the_caching_allocator(tmp_path, name):
    model, batch, loss_fn = CASES[name].build()
    predicted = estimate(model, batch, loss_fn, _adamw, device="cuda", out_dir=tmp_path)
    model, batch, loss_fn = CASES[name].build()
    model, batch = model.cuda(), _to_cuda(batch)
    optimizer = _adamw(list(model.parameters()))
    train_step(model, batch, loss_fn, optimizer)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    flat = batch if isinstance(batch, tuple) else (batch,)
    known = _blocks([*model.parameters(), *model.buffers(), *state, *flat])
    unknown = torch.cuda.memory_allocated() - known  # cuBLAS's workspace and the like
    torch.cuda.reset_peak_memory_stats()
    train_step(model, batch, loss_fn, optimizer)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - unknown
    assert abs(predicted.peak_bytes - measured) <= 0.03 * measured, (predicted.peak_bytes, measured)
    assert predicted.reserved_peak_bytes is not None and predicted.reserved_peak_bytes >= predicted.peak_bytes
