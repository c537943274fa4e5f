"""The GRPO/PPO clipped policy loss and the log-prob computation it needs (pure torch).

ratio = exp(logp - old_logp), clipped to [1 - clip_eps, 1 + clip_eps_high]; the per-token loss is
the larger of the two negated terms (slime's ``compute_policy_loss``). The step loss is the
token-mean over the loss mask of the *whole* step (all micro-batches of all ranks), so that a
2-rank run computes the same gradient as a 1-rank run on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

LOGPROB_CHUNK = 4096
"""Positions per chunk of the float32 log-softmax (bounds the float32 copy of the logits)."""


def _chunk_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, chunk: int = LOGPROB_CHUNK) -> torch.Tensor:
    """Log-probability of each ``targets[i]`` under ``logits[i]`` (shapes [T, V] and [T]).

    Computed in float32, ``chunk`` positions at a time; with autograd on, each chunk is
    recomputed in backward instead of keeping a float32 copy of all logits alive.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    parts = []
    for start in range(0, targets.shape[0], chunk):
        piece, tgt = logits[start : start + chunk], targets[start : start + chunk]
        if torch.is_grad_enabled() and piece.requires_grad:
            parts.append(checkpoint(_chunk_log_probs, piece, tgt, use_reentrant=False))
        else:
            parts.append(_chunk_log_probs(piece, tgt))
    return torch.cat(parts) if parts else logits.new_zeros((0,), dtype=torch.float32)


def per_token_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy loss and a 0/1 tensor marking tokens where the clip was active."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float()


@dataclass
class LossParts:
    """Sums over one micro-batch; divide by the step's loss-token count to get means."""

    loss_sum: torch.Tensor
    clipped_tokens: float
    loss_tokens: float


def micro_batch_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    has_old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
) -> LossParts:
    """Masked sum of the policy loss of one micro-batch (all tensors are per target position).

    Where a token has no rollout log prob (``has_old_logp`` is 0) the old policy is the detached
    current one, so the ratio is exactly 1 there.
    """
    old = torch.where(has_old_logp.bool(), old_logp, logp.detach())
    loss, clipped = per_token_policy_loss(logp, old, advantages, clip_eps, clip_eps_high)
    return LossParts(
        loss_sum=(loss * loss_mask).sum(),
        clipped_tokens=float((clipped * loss_mask).sum()),
        loss_tokens=float(loss_mask.sum()),
    )
