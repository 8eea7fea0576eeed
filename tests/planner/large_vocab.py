"""A Llama whose logits dominate its training step, profiled: the case the loss stage's chunked options are for.

A 32,000-token vocabulary on two layers of width 64 at 128 tokens: the logits and their log-softmax are
2 x 15.6 MiB in float32, while every layer's activations together are about 1 MiB, as a 128k vocabulary
outweighs the small layers of benchmark 10's ``--model llama``. The chain finder must still pick the layers
(the head and its loss then form the loss stage, which can be chunked) over the chain (model, ``lm_head``).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, WIDTH, LAYERS, SEQ, BATCH = 32_000, 64, 2, 128, 1
LAYER_NAMES = tuple(f"model.layers.{i}" for i in range(LAYERS))


def large_vocab_llama() -> torch.nn.Module:
    """``LlamaForCausalLM`` from its config (untied head, grouped-query attention), random weights, training."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=WIDTH * 8 // 3,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQ, use_cache=False, attn_implementation="eager")
    return LlamaForCausalLM(config).train()


def profile_large_vocab_llama(out_dir: Path, steps: int = 3) -> Path:
    """Profiles ``steps`` training steps (SGD) of :func:`large_vocab_llama` into ``out_dir``; its run directory."""
    from memprof import MemoryProfiler

    model = large_vocab_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=False) as profiler:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            profiler.record_stats()
    return Path(profiler.run_dir)
