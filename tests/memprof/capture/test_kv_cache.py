"""The profiler says so, once, when a training step builds a key/value cache it never reads."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from memprof import MemoryProfiler
from memprof.capture.kv_cache import cache_bytes

_VOCAB, _LAYERS, _EMBD, _BATCH, _SEQ = 128, 4, 32, 2, 16


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=_VOCAB, n_positions=32, n_embd=_EMBD, n_layer=_LAYERS, n_head=2,
                        bos_token_id=_VOCAB - 1, eos_token_id=_VOCAB - 1)  # use_cache=True: the default
    return GPT2LMHeadModel(config).train()


def _train(model: nn.Module, tmp_path, steps: int = 3) -> list[str]:
    ids = torch.randint(0, _VOCAB, (_BATCH, _SEQ))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MemoryProfiler(model, out_dir=tmp_path, print_period=0, background=False) as profiler:
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
                profiler.record_stats()
    return [str(w.message) for w in caught if "key/value cache" in str(w.message)]


def test_a_training_step_that_returns_a_cache_is_named_once_with_its_size(tmp_path) -> None:
    said = _train(_gpt2(), tmp_path)
    # every layer keeps its keys and its values: batch x seq x embd float32 each
    expected = _LAYERS * 2 * _BATCH * _SEQ * _EMBD * 4
    assert expected == 32 * 1024
    assert len(said) == 1, said
    assert "DynamicCache, 32.0 KiB" in said[0] and "use_cache = False" in said[0]


def test_no_warning_without_a_cache_or_outside_training(tmp_path) -> None:
    model = _gpt2()
    model.config.use_cache = False
    assert _train(model, tmp_path / "off") == []
    model = _gpt2().eval()  # evaluation may keep its cache: nothing to say
    assert _train(model, tmp_path / "eval", steps=1) == []


def test_cache_bytes_counts_each_storage_once() -> None:
    shared = torch.zeros(10)
    output = {"past_key_values": [(shared, shared[:5]), (torch.zeros(3, dtype=torch.float64),)]}
    assert cache_bytes(output) == ("list", 10 * 4 + 3 * 8)
    assert cache_bytes({"past_key_values": None}) is None
    assert cache_bytes(torch.zeros(2)) is None


def test_the_watchers_hook_is_removed_on_close(tmp_path) -> None:
    model = _gpt2()
    model.config.use_cache = False
    before = len(model._forward_hooks)
    with MemoryProfiler(model, out_dir=tmp_path, print_period=0, background=False):
        assert len(model._forward_hooks) > before
    assert len(model._forward_hooks) == before


def test_the_cache_is_read_without_transformers_deprecated_names(tmp_path, monkeypatch) -> None:
    """transformers 5 names the field ``cache`` and logs a deprecation for every ``past_key_values`` read."""
    from transformers.utils import generic

    logged: list[str] = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda message, *args, **kwargs: logged.append(message))
    said = _train(_gpt2(), tmp_path)
    assert len(said) == 1 and "DynamicCache, 32.0 KiB" in said[0], said
    assert not [m for m in logged if "past_key_values" in m], logged


def test_only_a_transformers_cache_under_the_new_name_is_taken_for_one() -> None:
    class Cache:  # stands for transformers.cache_utils.Cache: recognised by the name of a base class
        pass

    class DynamicCache(Cache):
        def __init__(self) -> None:
            self.keys = [torch.zeros(4)]

    assert cache_bytes({"cache": DynamicCache()}) == ("DynamicCache", 16)
    assert cache_bytes({"cache": [torch.zeros(4)]}) is None  # some other model's field named cache
