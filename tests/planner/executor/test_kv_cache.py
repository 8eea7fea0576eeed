"""Models whose config defaults to ``use_cache=True`` train with a schedule, as Hugging Face's own checkpointing does.

``GPT2Config()`` and ``LlamaConfig()`` default to ``use_cache=True``: a training forward then hands every block
a key/value cache, which a recomputed block would extend twice. ``apply_schedule`` (and the exported file)
turns the config's cache off while the schedule is installed, with one warning, and ``remove_schedule`` puts
it back.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from planner import apply_schedule, min_feasible_budget, solve
from planner.executor import remove_schedule
from planner.export.files import export_python
from tests.planner.executor.helpers import chain_for
from tests.planner.executor.test_export import _load

_VOCAB = 128


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=_VOCAB, n_positions=32, n_embd=32, n_layer=4, n_head=2,
                                       bos_token_id=_VOCAB - 1, eos_token_id=_VOCAB - 1))
    return model.train()


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    return model.train()


MODELS = {"gpt2": (_gpt2, "transformer.h."), "llama": (_llama, "model.layers.")}


def _schedule(model: nn.Module, prefix: str):
    chain = chain_for(model.get_submodule(prefix.rstrip(".")), prefix)
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    assert any(op.kind.value == "F_ck" for op in schedule.ops)  # a block is recomputed
    return schedule


def _grads(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # GPT-2's default dropout replays the same masks
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_default_config_trains_with_a_schedule_and_gets_its_cache_back(name: str) -> None:
    build, prefix = MODELS[name]
    model = build()
    assert model.config.use_cache is True  # the config's default
    ids = torch.randint(0, _VOCAB, (2, 16))
    reference = copy.deepcopy(model)
    reference.config.use_cache = False
    ref_loss, ref_grads = _grads(reference, ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_schedule(model, _schedule(model, prefix))
    said = [str(w.message) for w in caught if "use_cache" in str(w.message)]
    assert len(said) == 1 and "gradient_checkpointing_enable" in said[0], said
    assert caught[0].filename == __file__  # points at the user's apply_schedule call
    assert model.config.use_cache is False
    loss, grads = _grads(model, ids)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    remove_schedule(model)
    assert model.config.use_cache is True


def test_an_explicit_cache_in_training_is_still_refused_clearly() -> None:
    model = _gpt2()
    with pytest.warns(UserWarning, match="use_cache=True"):
        apply_schedule(model, _schedule(model, "transformer.h."))
    ids = torch.randint(0, _VOCAB, (2, 16))
    with pytest.raises(RuntimeError, match="key/value cache"):
        model(input_ids=ids, labels=ids, use_cache=True)


def test_a_config_without_a_cache_is_left_alone_silently() -> None:
    model = _gpt2()
    model.config.use_cache = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, _schedule(model, "transformer.h."))
    remove_schedule(model)
    assert model.config.use_cache is False


def test_the_exported_file_turns_the_cache_off_too(tmp_path) -> None:
    model = _gpt2()
    ids = torch.randint(0, _VOCAB, (2, 16))
    reference = copy.deepcopy(model)
    reference.config.use_cache = False
    ref_loss, ref_grads = _grads(reference, ids)
    exported = _load(tmp_path, export_python(_schedule(model, "transformer.h.")), "apply_gpt2_cache")
    with pytest.warns(UserWarning, match="use_cache=True"):
        exported.apply_schedule(model)
    loss, grads = _grads(model, ids)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
