"""Samples -> training data for the builtin trainer (pure functions, no torch needed).

GRPO as slime computes it: rewards are raw in dumps; per group, subtract the group mean and
divide by (std + 1e-6) unless disabled (std is the unbiased sample std, as ``torch.std``; a group
of one sample has advantage 0). Every response token gets its sample's advantage.

Garbage is refused here, naming the sample and field, because it would otherwise train silently
(issue 19): token ids that are not ints in [0, 2^31) (floats, bools, digit strings), log probs
that are not finite or outside [LOG_PROB_MIN, LOG_PROB_MAX], rewards whose group normalization
overflows, a rollout in which no sample has a loss token. With the model's :class:`ModelLimits`, token
ids outside its vocabulary and samples longer than its positions are refused too. What slime itself
accepts is counted instead: samples whose loss mask is all zeros (``remove_sample`` makes them) and a
dump whose top-level ``rollout_id`` differs from the rollout its file stands for (slime never reads it).

:class:`Conversion` is the trainer's conversion under a job's settings: the rollout manager and
``replay.verify`` (`dumps verify`, `forge-replay run`'s pre-flight) both call it, so verify refuses
exactly what training would. :func:`check_samples` runs the per-sample checks alone, for a verify
that does not know the job's settings.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_replay.dumps.bounds import quote
from forge_replay.dumps.sample import Sample, SampleError
from forge_replay.dumps.stretch import STRETCH_FIELD, StretchRecord, position_problem, stretch_samples

STD_EPS = 1e-6
TOKEN_ID_MAX = 2**31 - 1  # token ids are int32 on the way to the model
# A sampled token's log probability: 0 at most (a little more for rounding), and never so negative that
# exp(logp - old_logp) overflows in the policy ratio (e^-10000 is far below any sampled token).
LOG_PROB_MIN, LOG_PROB_MAX = -1e4, 1e-3


@dataclass(frozen=True)
class ModelLimits:
    """What the model accepts, from its config (``vocab_size``, ``max_position_embeddings``); None: not checked."""

    vocab_size: int | None = None
    max_positions: int | None = None


NO_LIMITS = ModelLimits()


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
    masked_out: int = 0  # samples whose loss mask is all zeros (counted: slime accepts them)
    multimodal_ignored: int = 0  # samples with images / pixel_values: their tokens train, the rest is ignored
    stretch: StretchRecord | None = None  # spec.replay.stretch: what stretching this rollout did (None: not stretched)

    def __len__(self) -> int:
        return len(self.tokens)


def _as_int_list(value: Any, index: int, field_name: str) -> list[int]:
    if hasattr(value, "tolist") and not isinstance(value, list):
        value = value.tolist()
    if not isinstance(value, list):
        raise SampleError(index, field_name, f"expected a list of ints, got {type(value).__name__}")
    return value


def _tokens(sample: Sample, index: int, limits: ModelLimits = NO_LIMITS) -> list[int]:
    tokens = _as_int_list(sample.tokens, index, "tokens")
    if not tokens:
        raise SampleError(index, "tokens", "is empty")
    if not set(map(type, tokens)) <= {int}:
        position, bad = next((i, t) for i, t in enumerate(tokens) if type(t) is not int)
        raise SampleError(index, "tokens", f"token {position} is {quote(bad)} ({type(bad).__name__}); token ids are ints")
    low, high = min(tokens), max(tokens)
    if low < 0 or high > TOKEN_ID_MAX:
        position, bad = next((i, t) for i, t in enumerate(tokens) if not 0 <= t <= TOKEN_ID_MAX)
        raise SampleError(index, "tokens", f"token {position} is {quote(bad)}; token ids are in [0, 2^31)")
    vocab, positions = limits.vocab_size, limits.max_positions
    if vocab is not None and high >= vocab:
        position = next(i for i, t in enumerate(tokens) if t >= vocab)
        raise SampleError(index, "tokens", f"token {position} is {tokens[position]}, outside"
                          f" the model's vocabulary [0, {vocab}) (vocab_size); the dumps were made with"
                          " another tokenizer, or the model config is not the dumps' model")
    if positions is not None and len(tokens) > positions:
        raise SampleError(index, "tokens", f"holds {len(tokens)} tokens, more than the model's {positions} positions"
                          " (max_position_embeddings)")
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
    if not set(map(type, mask)) <= {int, bool} or any(m not in (0, 1) for m in mask):
        bad = next(m for m in mask if type(m) not in (int, bool) or m not in (0, 1))
        raise SampleError(index, "loss_mask", f"holds {quote(bad)}; only 0 and 1 are allowed")
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
    try:
        value = float(reward) if isinstance(reward, numbers.Real) and not isinstance(reward, bool) else math.nan
    except OverflowError:  # an int like 10**400
        value = math.nan
    if not math.isfinite(value):
        raise SampleError(index, "reward", f"{quote(reward)} is not a finite number")
    return value


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
    types = set(map(type, value))
    if not types <= {float, int}:
        position, bad = next((i, v) for i, v in enumerate(value) if type(v) not in (float, int))
        raise SampleError(index, "rollout_log_probs", f"value {position} is {quote(bad)}; log probs are numbers")
    # A copy either way (the sample keeps its own list); list() of floats is a C-level copy, float() per value is
    # the costliest step of a verify when every value is a float already (as slime writes them).
    try:
        values = list(value) if types <= {float} else [float(v) for v in value]
    except OverflowError:  # an int beyond float range (10**400): out of range, refused below like any other
        values = None
    if values is None or (values and not (
            LOG_PROB_MIN <= min(values) and max(values) <= LOG_PROB_MAX and math.isfinite(sum(values)))):
        position, bad = next((i, v) for i, v in enumerate(value) if not LOG_PROB_MIN <= v <= LOG_PROB_MAX)
        raise SampleError(index, "rollout_log_probs",
                          f"value {position} is {quote(bad)}; log probs are in [{LOG_PROB_MIN:g}, {LOG_PROB_MAX:g}]")
    return values


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
        spread = sum(c * c for c in centered)
        if not math.isfinite(spread):  # e.g. rewards of +-1e308: the mean or the variance overflows
            raise SampleError(
                indices[0],
                "reward",
                f"the rewards of its group ({quote([rewards[i] for i in indices])}) overflow when normalized",
            )
        if normalize_std:
            std = math.sqrt(spread / (len(values) - 1)) if len(values) > 1 else 0.0
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
    limits: ModelLimits = NO_LIMITS,
) -> TrainData:
    """Convert replayed samples to training inputs; inconsistent samples raise SampleError (index, field)."""
    if not samples:
        raise SampleError(None, "samples", "no samples to train on")
    tokens, lengths, masks, rewards, log_probs, truncated, rollout_ids = [], [], [], [], [], [], []
    for i, sample in enumerate(samples):
        sample_tokens, length, mask, log_prob = _checked(sample, i, limits)
        tokens.append(sample_tokens)
        lengths.append(length)
        masks.append(mask)
        rewards.append(_reward(sample, i, reward_key))
        log_probs.append(log_prob)
        truncated.append(Sample.Status(sample.status) is Sample.Status.TRUNCATED)
        rollout_ids.append(sample.rollout_id)
    _log_probs_all_or_none(log_probs)
    masked_out = _masked_out(masks)
    group_ids = group_ids_for(samples, n_samples_per_prompt)
    return TrainData(
        tokens=tokens,
        response_lengths=lengths,
        loss_masks=masks,
        rewards=rewards,
        advantages=grpo_advantages(rewards, group_ids, normalize_std),
        rollout_log_probs=log_probs if all(lp is not None for lp in log_probs) else None,
        truncated=truncated,
        rollout_ids=rollout_ids,
        group_ids=group_ids,
        masked_out=masked_out,
        multimodal_ignored=sum(1 for sample in samples if sample.has_multimodal_inputs()),
    )


def _checked(sample: Sample, index: int, limits: ModelLimits) -> tuple[list[int], int, list[int], list[float] | None]:
    """One sample's tokens, response length, loss mask and log probs, each checked (SampleError)."""
    if not isinstance(sample.rollout_id, int | None) or isinstance(sample.rollout_id, bool):
        raise SampleError(index, "rollout_id", f"{quote(sample.rollout_id)} is not an int or None")
    tokens = _tokens(sample, index, limits)
    length = _response_length(sample, index, len(tokens))
    return tokens, length, _loss_mask(sample, index, length), _log_probs(sample, index, length)


def _log_probs_all_or_none(log_probs: list[list[float] | None]) -> None:
    present = [lp is not None for lp in log_probs]
    if any(present) and not all(present):
        missing = present.index(False)
        raise SampleError(missing, "rollout_log_probs", "is None while other samples have rollout log probs")


def _masked_out(masks: list[list[int]]) -> int:
    """How many samples have no loss token; SampleError when none has one (nothing would train)."""
    count = sum(1 for mask in masks if not any(mask))
    if masks and count == len(masks):
        raise SampleError(None, "loss_mask", f"all {count} samples have an all-zero loss mask: nothing to train on")
    return count


@dataclass(frozen=True)
class Conversion:
    """The trainer's conversion of one rollout under a job's settings and its model's limits.

    The rollout manager converts every rollout with it, and ``replay.verify`` runs it on every train dump before
    any GPU is requested: one function, so verify refuses exactly what training would. With ``stretch_max_tokens``
    (spec.replay.stretch.maxTokens) the samples are stretched first
    (:func:`~forge_replay.dumps.stretch.stretch_samples`): the stretched samples are what is checked and converted."""

    n_samples_per_prompt: int | None = None
    normalize_std: bool = True
    reward_key: str | None = None
    limits: ModelLimits = NO_LIMITS
    stretch_max_tokens: int | None = None

    @classmethod
    def for_job(cls, spec: Any, limits: ModelLimits = NO_LIMITS) -> Conversion:
        """The conversion a ForgeReplayJob ``spec`` trains with (trainer.nSamplesPerPrompt,
        trainer.normalizeAdvantageStd, replay.rewardKey, replay.stretch)."""
        trainer, stretch = spec.trainer, spec.replay.stretch
        return cls(trainer.n_samples_per_prompt, trainer.normalize_advantage_std, spec.replay.reward_key, limits,
                   None if stretch is None else stretch.max_tokens)

    def __call__(self, samples: Sequence[Sample]) -> TrainData:
        record = None
        if self.stretch_max_tokens is not None:
            problem = position_problem(self.stretch_max_tokens, self.limits.max_positions)
            if problem:
                raise SampleError(None, STRETCH_FIELD, problem.removeprefix(f"{STRETCH_FIELD}: "))
            samples, record = stretch_samples(samples, self.stretch_max_tokens)
        data = to_train_data(samples, n_samples_per_prompt=self.n_samples_per_prompt,
                             normalize_std=self.normalize_std, reward_key=self.reward_key, limits=self.limits)
        data.stretch = record
        return data


def check_samples(samples: Sequence[Sample], reward_key: str | None = None, limits: ModelLimits = NO_LIMITS) -> int:
    """The per-sample checks of :func:`to_train_data`, for a verify that does not know the job's settings;
    returns the masked-out count.

    Rewards are checked when they are numbers, or dicts and ``reward_key`` is given. Grouping needs the job's
    settings: a verify that has them runs :class:`Conversion` instead.
    """
    masks, log_probs = [], []
    for i, sample in enumerate(samples):
        _, _, mask, log_prob = _checked(sample, i, limits)
        masks.append(mask)
        log_probs.append(log_prob)
        if not isinstance(sample.reward, dict) or reward_key is not None:
            _reward(sample, i, reward_key)
    _log_probs_all_or_none(log_probs)
    return _masked_out(masks)


def rollout_id_note(inner: int, expected: int | None) -> str:
    """A note when a dump's top-level ``rollout_id`` is not the rollout its file stands for ("" otherwise).

    slime never reads that field, so the dump is not refused; verify reports and counts it, because
    a misnamed or copied file would otherwise train in the wrong place unnoticed.
    """
    if expected is None or inner == expected:
        return ""
    return f"the dump's rollout_id is {inner}, its file stands for rollout {expected}"
