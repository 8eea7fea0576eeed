"""The hooks' cheap storage addresses, and one autograd-node pre-hook per activation."""

from __future__ import annotations

import torch
from torch import nn

from memprof.analysis.records import Mark
from memprof.capture.hooks import HookRecorder
from memprof.capture.tensor_walk import (
    module_tree,
    optimizer_state,
    optimizer_state_addresses,
    pointer,
    pointers,
    storages,
)


def test_pointers_give_the_storage_address_of_tensors_and_views() -> None:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    cases = [base, base[2:], base[:, 3], base.t(), base[1:3, 2:5], nn.Parameter(torch.ones(3)),
             torch.zeros(5, dtype=torch.bfloat16)[1:], torch.empty(0)]
    for tensor in cases:
        assert [p for p, _ in pointers(tensor)] == [p for p, _ in storages(tensor)]
    # a whole tensor's bytes are its storage's
    assert pointers(base) == storages(base)
    # nested outputs are walked like storages() does
    nested = (base, {"a": base[1:], "b": [torch.ones(2)]}, 3, None)
    assert [p for p, _ in pointers(nested)] == [p for p, _ in storages(nested)]


def test_pointers_skip_tensors_without_a_storage() -> None:
    sparse = torch.eye(3).to_sparse()
    assert pointers(sparse) == storages(sparse) == []


def test_a_chain_shares_one_node_hook_per_activation_and_marks_each_module_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    names, modules = module_tree(model)
    recorder = HookRecorder(modules, list(model.parameters()), None)
    recorder.attach()
    try:
        hidden = model[0](torch.randn(3, 4, requires_grad=False))
        out = model[2](model[1](hidden))
        # one hook on the Linear's output node: its own backward enter and the ReLU's backward exit
        pending = hidden.grad_fn.metadata[recorder._node_key]
        assert [(kind, index) for kind, index, _, _ in pending] == [(Mark.BWD_ENTER, 1), (Mark.BWD_EXIT, 2)]
        recorder.drain()
        model(torch.randn(3, 4)).sum().backward()
        marks = recorder.drain().marks
    finally:
        recorder.detach()
    for kind in (Mark.BWD_ENTER, Mark.BWD_EXIT):
        indices = sorted(m[2] for m in marks if m[1] == kind)
        # the root and every child once each; no gradient flows into the input the root and the
        # first Linear share, so neither has a backward exit
        expected = [0, 1, 2, 3] if kind == Mark.BWD_ENTER else [2, 3]
        assert indices == expected, (kind, indices)
    assert out.shape == (3, 2)


def test_pointer_is_the_one_entry_of_pointers() -> None:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    cases = [base, base[2:], base[:, 3], base.t(), nn.Parameter(torch.ones(3)), torch.empty(0),
             torch.zeros(5, dtype=torch.bfloat16)[1:], torch.eye(3).to_sparse()]
    for tensor in cases:
        found = pointers(tensor)
        assert pointer(tensor) == (found[0] if found else None)


def _adam_after_steps(steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def _generic_addresses(optimizer: torch.optim.Optimizer) -> list[int]:
    return [ptr for ptr, _ in optimizer_state(optimizer, exact=False)]


def test_optimizer_state_addresses_are_the_generic_walks() -> None:
    model, optimizer = _adam_after_steps(0)
    assert optimizer_state_addresses(optimizer) == _generic_addresses(optimizer) == []  # no state before a step
    model, optimizer = _adam_after_steps(2)
    assert len(optimizer_state_addresses(optimizer)) == 3 * len(list(model.parameters()))  # step, two moments
    assert optimizer_state_addresses(optimizer) == _generic_addresses(optimizer)
    # state replaced (as load_state_dict does), a view with an offset, nested and odd values, a storage swapped
    optimizer.load_state_dict(optimizer.state_dict())
    assert optimizer_state_addresses(optimizer) == _generic_addresses(optimizer)
    first, second, *_ = optimizer.state.values()
    first["exp_avg"] = torch.zeros(40)[8:]
    first["extra"] = [torch.ones(2), (torch.ones(3), {"deep": torch.ones(1)}), 3.0]
    first["parameter"] = nn.Parameter(torch.ones(2))
    first["sparse"] = torch.eye(2).to_sparse()
    first["none"] = None
    second["exp_avg_sq"].set_(torch.zeros(second["exp_avg_sq"].shape))
    assert optimizer_state_addresses(optimizer) == _generic_addresses(optimizer)


def test_drain_drops_the_finalizers_of_freed_inputs_only() -> None:
    recorder = HookRecorder([nn.Identity()], [], None)
    kept, freed = torch.ones(4), torch.ones(8)
    recorder.watch_free(kept)
    recorder.watch_free(freed)
    freed_ptr, kept_ptr = freed.data_ptr(), kept.data_ptr()
    del freed
    frees = recorder.drain().frees
    assert [ptr for _, ptr in frees] == [freed_ptr]
    assert list(recorder._finalizers) == [kept_ptr] and recorder._finalizers[kept_ptr].alive
    assert recorder.drain().frees == []
    recorder.detach()
