"""Packed micro-batches attend per sample without a [T, T] mask, and match unpacked samples exactly."""

from __future__ import annotations

import pytest
import torch

from forge_replay.runtime.trainer.batching import segment_bounds
from forge_replay.dumps.model_config import config_from_dict
from forge_replay.runtime.trainer.model import PACKED_ATTENTION, attention_for, build_model

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
QWEN3 = {**LLAMA, "model_type": "qwen3", "head_dim": 16}


@pytest.mark.parametrize("positions, bounds", [
    ([0, 1, 2, 0, 1], [0, 3, 5]),
    ([0, 1, 2, 3], [0, 4]),
    ([0, 0, 0], [0, 1, 2, 3]),
    ([], [0]),
])
def test_segment_bounds(positions, bounds):
    assert segment_bounds(positions) == bounds


@pytest.mark.parametrize("config", [LLAMA, QWEN3], ids=["llama", "qwen3"])
def test_a_packed_micro_batch_equals_its_samples_run_alone(config):
    model = build_model(config, seed=0, gradient_checkpointing=False)
    assert model.config._attn_implementation == PACKED_ATTENTION
    generator = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 128, (n,), generator=generator) for n in (5, 9, 3)]
    packed = torch.cat(samples).unsqueeze(0)
    positions = torch.cat([torch.arange(len(s)) for s in samples]).unsqueeze(0)
    bounds = torch.tensor(segment_bounds(positions[0].tolist()), dtype=torch.int32)
    logits = model(input_ids=packed, position_ids=positions, use_cache=False, cu_seq_lens_q=bounds,
                   cu_seq_lens_k=bounds, max_length_q=9, max_length_k=9).logits
    alone = torch.cat([model(input_ids=s.unsqueeze(0), use_cache=False).logits for s in samples], dim=1)
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-5)
    # without bounds they come from where the positions restart
    torch.testing.assert_close(model(input_ids=packed, position_ids=positions, use_cache=False).logits, alone,
                               rtol=1e-5, atol=1e-5)
    # and they matter: bounds of one segment let the later samples see the earlier ones
    whole = torch.tensor([0, packed.shape[1]], dtype=torch.int32)
    leaked = model(input_ids=packed, position_ids=positions, use_cache=False, cu_seq_lens_q=whole,
                   cu_seq_lens_k=whole, max_length_q=17, max_length_k=17).logits
    torch.testing.assert_close(leaked[:, :5], alone[:, :5], rtol=1e-5, atol=1e-5)  # the first sees nothing new
    assert not torch.allclose(leaked[:, 5:], alone[:, 5:], atol=1e-4)


def test_gradients_of_a_packed_micro_batch_equal_those_of_its_samples():
    model = build_model(LLAMA, seed=0, gradient_checkpointing=True)
    model.train()
    samples = [torch.arange(7) % 128, (torch.arange(4) * 5) % 128]
    bounds = torch.tensor([0, 7, 11], dtype=torch.int32)
    positions = torch.cat([torch.arange(7), torch.arange(4)]).unsqueeze(0)
    model(input_ids=torch.cat(samples).unsqueeze(0), position_ids=positions, use_cache=False, cu_seq_lens_q=bounds,
          cu_seq_lens_k=bounds, max_length_q=7, max_length_k=7).logits.square().mean().mul(11).backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for sample in samples:
        model(input_ids=sample.unsqueeze(0), use_cache=False).logits.square().sum().div(128).backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(packed_grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("config, expected", [
    (LLAMA, PACKED_ATTENTION),
    (QWEN3, PACKED_ATTENTION),
    ({**LLAMA, "model_type": "mistral", "sliding_window": 16}, "sdpa"),  # sliding window: transformers' own sdpa
    ({**QWEN3, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, "sdpa"),
    ({**LLAMA, "model_type": "gemma2", "head_dim": 16}, "sdpa"),  # soft-capping and sliding layers
])
def test_models_with_more_than_full_causal_attention_keep_sdpa(config, expected):
    assert attention_for(config_from_dict(config)) == expected
