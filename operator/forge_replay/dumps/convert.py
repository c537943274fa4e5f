"""Samples -> training data for the builtin trainer (pure functions, no torch needed).

GRPO as slime computes it: rewards are raw in dumps; per group, subtract the group mean and
divide by (std + 1e-6) unless disabled (std is the unbiased sample std, as ``torch.std``; a group
of one sample has advantage 0). Every response token gets its sample's advantage.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_replay.dumps.sample import Sample, SampleError

STD_EPS = 1e-6


@dataclass
class TrainData:
    """Per-sample training inputs, all lists aligned with the input samples."""

    tokens: list[list[int]]
    response_lengths: list[int]
    loss_masks: list[list[int]]
    rewards: list[float]
    advantages: list[float]
    rollout_log_probs: list[list[float]] | None
    truncated: list[bool]
    rollout_ids: list[int | None]
    group_ids: list[int]

    def __len__(self) -> int:
        return len(self.tokens)


def _as_int_list(value: Any, index: int, field_name: str) -> list[int]:
    if hasattr(value, "tolist") and not isinstance(value, list):
        value = value.tolist()
    if not isinstance(value, list):
        raise SampleError(index, field_name, f"expected a list of ints, got {type(value).__name__}")
    return value


def _tokens(sample: Sample, index: int) -> list[int]:
    tokens = _as_int_list(sample.tokens, index, "tokens")
    if not tokens:
        raise SampleError(index, "tokens", "is empty")
    return tokens


def _response_length(sample: Sample, index: int, num_tokens: int) -> int:
    length = sample.response_length
    if not isinstance(length, int) or isinstance(length, bool):
        raise SampleError(index, "response_length", f"expected an int, got {length!r}")
    if length < 0 or length > num_tokens:
        raise SampleError(index, "response_length", f"{length} is outside 0..len(tokens)={num_tokens}")
    if length == num_tokens:
        raise SampleError(index, "response_length", f"{length} leaves no prompt token (len(tokens)={num_tokens})")
    return length


def _loss_mask(sample: Sample, index: int, response_length: int) -> list[int]:
    if sample.remove_sample:
        return [0] * response_length
    if sample.loss_mask is None:
        return [1] * response_length
    mask = _as_int_list(sample.loss_mask, index, "loss_mask")
    if len(mask) != response_length:
        raise SampleError(index, "loss_mask", f"has length {len(mask)}, expected response_length={response_length}")
    if any(m not in (0, 1) for m in mask):
        bad = next(m for m in mask if m not in (0, 1))
        raise SampleError(index, "loss_mask", f"holds {bad!r}; only 0 and 1 are allowed")
    return [int(m) for m in mask]


def _reward(sample: Sample, index: int, reward_key: str | None) -> float:
    reward = sample.reward
    if reward is None:
        raise SampleError(index, "reward", "is None; training needs a reward for every sample")
    if isinstance(reward, dict):
        if reward_key is None:
            raise SampleError(index, "reward", f"is a dict (keys {sorted(map(str, reward))}); set replay.rewardKey")
        if reward_key not in reward:
            raise SampleError(index, "reward", f"has no key {reward_key!r} (keys {sorted(map(str, reward))})")
        reward = reward[reward_key]
    if hasattr(reward, "item") and not isinstance(reward, numbers.Number):
        reward = reward.item()
    if not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise SampleError(index, "reward", f"{reward!r} is not a finite number")
    return float(reward)


def _log_probs(sample: Sample, index: int, response_length: int) -> list[float] | None:
    value = sample.rollout_log_probs
    if value is None:
        return None
    if hasattr(value, "tolist") and not isinstance(value, list):
        value = value.tolist()
    if not isinstance(value, list):
        raise SampleError(index, "rollout_log_probs", f"expected a list of floats, got {type(value).__name__}")
    if len(value) != response_length:
        raise SampleError(
            index, "rollout_log_probs", f"has length {len(value)}, expected response_length={response_length}"
        )
    return [float(v) for v in value]


def group_ids_for(samples: Sequence[Sample], n_samples_per_prompt: int | None) -> list[int]:
    """Dense group id per sample: ``n`` consecutive samples, or equal ``group_index`` when n is None."""
    if n_samples_per_prompt is not None:
        if n_samples_per_prompt < 1:
            raise SampleError(None, "n_samples_per_prompt", f"must be >= 1, got {n_samples_per_prompt}")
        if len(samples) % n_samples_per_prompt:
            raise SampleError(
                None,
                "n_samples_per_prompt",
                f"{len(samples)} samples do not split into groups of {n_samples_per_prompt}",
            )
        return [i // n_samples_per_prompt for i in range(len(samples))]
    dense: dict[Any, int] = {}
    ids = []
    for i, sample in enumerate(samples):
        if sample.group_index is None:
            raise SampleError(i, "group_index", "is None; set trainer.nSamplesPerPrompt to group consecutive samples")
        ids.append(dense.setdefault(sample.group_index, len(dense)))
    return ids


def grpo_advantages(rewards: Sequence[float], group_ids: Sequence[int], normalize_std: bool = True) -> list[float]:
    """Per group: reward - mean, divided by (unbiased std + 1e-6) when ``normalize_std``."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    advantages = [0.0] * len(rewards)
    for indices in members.values():
        values = [rewards[i] for i in indices]
        mean = sum(values) / len(values)
        centered = [v - mean for v in values]
        if normalize_std:
            std = math.sqrt(sum(c * c for c in centered) / (len(values) - 1)) if len(values) > 1 else 0.0
            centered = [c / (std + STD_EPS) for c in centered]
        for i, value in zip(indices, centered):
            advantages[i] = value
    return advantages


def to_train_data(
    samples: Sequence[Sample],
    *,
    n_samples_per_prompt: int | None = None,
    normalize_std: bool = True,
    reward_key: str | None = None,
) -> TrainData:
    """Convert replayed samples to training inputs; inconsistent samples raise SampleError (index, field)."""
    if not samples:
        raise SampleError(None, "samples", "no samples to train on")
    tokens, lengths, masks, rewards, log_probs, truncated, rollout_ids = [], [], [], [], [], [], []
    for i, sample in enumerate(samples):
        sample_tokens = _tokens(sample, i)
        length = _response_length(sample, i, len(sample_tokens))
        tokens.append(sample_tokens)
        lengths.append(length)
        masks.append(_loss_mask(sample, i, length))
        rewards.append(_reward(sample, i, reward_key))
        log_probs.append(_log_probs(sample, i, length))
        truncated.append(Sample.Status(sample.status) is Sample.Status.TRUNCATED)
        rollout_ids.append(sample.rollout_id)
    present = [lp is not None for lp in log_probs]
    if any(present) and not all(present):
        missing = present.index(False)
        raise SampleError(missing, "rollout_log_probs", "is None while other samples have rollout log probs")
    group_ids = group_ids_for(samples, n_samples_per_prompt)
    return TrainData(
        tokens=tokens,
        response_lengths=lengths,
        loss_masks=masks,
        rewards=rewards,
        advantages=grpo_advantages(rewards, group_ids, normalize_std),
        rollout_log_probs=log_probs if all(present) else None,
        truncated=truncated,
        rollout_ids=rollout_ids,
        group_ids=group_ids,
    )
