"""Splitting a rollout across ranks, packing micro-batches, and what the packed sequence means."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from forge_replay.runtime.trainer.batching import (
    BatchError,
    assign_to_ranks,
    build_micro_batch,
    pack_micro_batches,
    plan_step,
)


def train_data(tokens, response_lengths, loss_masks=None, advantages=None, log_probs=None):
    return SimpleNamespace(
        tokens=tokens,
        response_lengths=response_lengths,
        loss_masks=loss_masks or [[1] * r for r in response_lengths],
        advantages=advantages or [1.0] * len(tokens),
        rollout_log_probs=log_probs,
    )


def test_ranks_get_every_sample_once_balanced_by_tokens():
    lengths = [100, 90, 10, 10, 10, 80, 5]
    ranks = assign_to_ranks(lengths, 3)
    assert sorted(i for r in ranks for i in r) == list(range(7))
    loads = [sum(lengths[i] for i in r) for r in ranks]
    assert max(loads) - min(loads) <= max(lengths)
    assert assign_to_ranks(lengths, 3) == ranks  # deterministic


def test_micro_batches_stay_under_the_token_budget_and_long_samples_go_alone():
    lengths = [300, 40, 60, 50, 10, 90]
    bins = pack_micro_batches(range(6), lengths, max_tokens=100)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert [0] in bins  # 300 tokens > budget: alone
    for b in bins:
        if b != [0]:
            assert sum(lengths[i] for i in b) <= 100


def test_every_rank_gets_the_same_number_of_micro_batches():
    lengths = [64, 64, 64, 8]  # rank 0: two 64-token samples -> 2 micro-batches; rank 1: 64 + 8 -> 1
    plan = plan_step(lengths, world_size=2, max_tokens=100)
    assert len(plan[0]) == len(plan[1]) == 2
    assert [] in plan[1]  # a dummy micro-batch keeps the collectives in step
    fewer_samples_than_ranks = plan_step([10], world_size=2, max_tokens=100)
    assert fewer_samples_than_ranks == [[[0]], [[]]]


def test_packed_micro_batch_aligns_masks_advantages_and_old_log_probs():
    data = train_data(
        tokens=[[1, 2, 3, 4], [5, 6, 7]],
        response_lengths=[2, 1],
        loss_masks=[[1, 0], [1]],
        advantages=[0.5, -2.0],
        log_probs=[[-0.1, -0.2], [-0.3]],
    )
    mb = build_micro_batch(data, [0, 1])
    assert mb.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert mb.loss_mask.tolist() == [0, 0, 1, 0, 0, 0, 1]
    assert mb.old_logp.tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, 0, -0.3])
    assert mb.has_old_logp.tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert mb.advantages.tolist() == [0.5] * 4 + [-2.0] * 3
    assert mb.num_tokens == 7


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (train_data([[1, 2]], [3]), "sample 0: response_length 3 exceeds len"),
        (train_data([[1, 2]], [2]), "sample 0: tokens has no prompt token"),
        (train_data([[1, 2, 3]], [2], loss_masks=[[1]]), "sample 0: loss_mask has 1 entries"),
        (train_data([[1, 2, 3]], [2], log_probs=[[-1.0]]), "sample 0: rollout_log_probs has 1 entries"),
    ],
)
def test_inconsistent_samples_name_the_index_and_field(data, message):
    with pytest.raises(BatchError, match=message):
        build_micro_batch(data, [0])


def test_token_ids_outside_the_vocabulary_are_named():
    data = train_data([[1, 2, 300, 4]], [2])
    with pytest.raises(BatchError, match=r"sample 0: tokens holds id 300, outside the model's vocabulary \[0, 128\)"):
        build_micro_batch(data, [0], vocab_size=128)
    assert build_micro_batch(data, [0], vocab_size=301).num_tokens == 4


def test_a_packed_sequence_scores_each_sample_as_if_alone():
    from forge_replay.runtime.trainer.loss import token_log_probs
    from forge_replay.runtime.trainer.model import build_model

    model = build_model(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128},
        seed=0, gradient_checkpointing=False,
    ).eval()
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 128, n).tolist() for n in (9, 5, 12)]
    data = train_data(samples, [3, 2, 4])

    def logps(mb):
        ids = torch.from_numpy(mb.input_ids)[None]
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=torch.from_numpy(mb.position_ids)[None], use_cache=False).logits
        lp = token_log_probs(logits[0, :-1], ids[0, 1:])
        return lp[torch.from_numpy(mb.loss_mask[1:]).bool()]

    alone = torch.cat([logps(build_micro_batch(data, [i])) for i in range(3)])
    packed = logps(build_micro_batch(data, [0, 1, 2]))
    assert torch.allclose(alone, packed, atol=1e-5)
