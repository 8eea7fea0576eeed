"""An estimate of a Hugging Face model says only what its user can act on: the key/value cache it builds (with
every storage counted), never torch's "Accessing the data pointer of FakeTensor is deprecated"."""

from __future__ import annotations

import warnings

import torch

from memprof import estimate
from memprof.capture.kv_cache import KeyValueCacheWarning

_LAYERS, _EMBD, _BATCH, _SEQ, _VOCAB = 2, 32, 2, 16, 128


def _gpt2_on_meta():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=_LAYERS, n_embd=_EMBD, n_head=2, vocab_size=_VOCAB, n_positions=32,
                        bos_token_id=_VOCAB - 1, eos_token_id=_VOCAB - 1)  # use_cache=True: the default
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def test_an_estimate_never_asks_a_fake_storage_for_its_data_pointer(tmp_path, monkeypatch) -> None:
    # torch warns about it once per process, so whether it warns says nothing here: the calls are counted
    asked: list[int] = []
    data_ptr = torch.UntypedStorage.data_ptr

    def counted(storage: torch.UntypedStorage) -> int:
        if storage.device.type == "meta":  # a fake tensor's storage
            asked.append(storage.nbytes())
        return data_ptr(storage)

    monkeypatch.setattr(torch.UntypedStorage, "data_ptr", counted)
    ids = torch.empty(_BATCH, _SEQ, dtype=torch.long, device="meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimate(_gpt2_on_meta(), ids, lambda m, x: m(input_ids=x, labels=x).loss, None, out_dir=tmp_path)
    assert asked == []
    said = [str(w.message) for w in caught if issubclass(w.category, KeyValueCacheWarning)]
    # every layer keeps its keys and its values, each its own storage: batch x seq x embd float32
    expected = _LAYERS * 2 * _BATCH * _SEQ * _EMBD * 4
    assert expected == 16 * 1024
    assert len(said) == 1 and "key/value cache (DynamicCache, 16.0 KiB)" in said[0], said
    assert not [w for w in caught if "FakeTensor" in str(w.message)]
