"""The clipped policy loss and the log-prob computation, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from forge_replay.runtime.trainer.loss import micro_batch_loss, per_token_policy_loss, token_log_probs


def test_per_token_loss_matches_hand_computed_values():
    # ratios e^0 = 1, e^0.5 ~ 1.6487 (clipped high for positive adv), e^-0.5 ~ 0.6065 (clipped low for negative adv)
    logp = torch.tensor([0.0, 0.5, -0.5, 0.5])
    old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = per_token_policy_loss(logp, old, adv, clip_eps=0.2, clip_eps_high=0.3)
    expected = [
        -1.0,  # ratio 1: no clip
        -1.3,  # adv>0, ratio 1.65: max(-1.65, -1.3) = -1.3 (clip active)
        0.8,  # adv<0, ratio 0.61: max(0.61, 0.8) = 0.8 (clip active)
        math.exp(0.5),  # adv<0, ratio 1.65: max(1.65, 1.3) = 1.65 (unclipped term wins)
    ]
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert clipped.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_asymmetric_clip_uses_clip_eps_high_only_above_one():
    logp = torch.tensor([1.0, -1.0])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = per_token_policy_loss(logp, torch.zeros(2), adv, clip_eps=0.1, clip_eps_high=0.5)
    assert loss.tolist() == pytest.approx([-1.5, 0.9], abs=1e-6)


def test_token_log_probs_equal_log_softmax_and_chunking_changes_nothing():
    torch.manual_seed(0)
    logits = torch.randn(37, 11, requires_grad=True)
    targets = torch.randint(0, 11, (37,))
    reference = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    chunked = token_log_probs(logits, targets, chunk=5)
    assert torch.allclose(chunked, reference, atol=1e-6)
    (g_ref,) = torch.autograd.grad(reference.sum(), logits)
    (g_chunk,) = torch.autograd.grad(token_log_probs(logits, targets, chunk=5).sum(), logits)
    assert torch.allclose(g_ref, g_chunk, atol=1e-6)


def test_token_log_probs_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="do not match"):
        token_log_probs(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))


def test_without_rollout_log_probs_the_ratio_is_one_and_the_mask_applies():
    logp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    parts = micro_batch_loss(
        logp,
        old_logp=torch.tensor([5.0, 5.0, 5.0]),  # ignored: has_old_logp is 0
        has_old_logp=torch.zeros(3),
        advantages=torch.tensor([2.0, 2.0, 2.0]),
        loss_mask=torch.tensor([1.0, 0.0, 1.0]),
        clip_eps=0.2,
        clip_eps_high=0.2,
    )
    assert float(parts.loss_sum) == pytest.approx(-4.0)
    assert parts.loss_tokens == 2.0 and parts.clipped_tokens == 0.0
    parts.loss_sum.backward()
    assert logp.grad.tolist() == pytest.approx([-2.0, 0.0, -2.0])  # d(-adv*ratio)/dlogp = -adv, masked


def test_rollout_log_probs_are_the_old_policy_where_present():
    logp = torch.tensor([0.0, 0.0])
    parts = micro_batch_loss(
        logp, old_logp=torch.tensor([-0.1, 9.0]), has_old_logp=torch.tensor([1.0, 0.0]),
        advantages=torch.tensor([1.0, 1.0]), loss_mask=torch.ones(2), clip_eps=0.2, clip_eps_high=0.2,
    )
    # token 0: ratio e^0.1 ~ 1.105 (inside the clip): -1.105; token 1: no old logp -> ratio 1: -1
    assert float(parts.loss_sum) == pytest.approx(-math.exp(0.1) - 1.0, abs=1e-6)
