"""Samples -> training data: masks, rewards, GRPO advantages (checked against torch), errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_replay.dumps import Sample, SampleError, load
from forge_replay.dumps.convert import grpo_advantages, to_train_data
from tests.unit.test_dumps_slime_format import save_debug_rollout_data, slime_samples


def _sample(reward=1.0, response_length=3, prompt_len=2, **kw):
    return Sample(tokens=list(range(prompt_len + response_length)), response_length=response_length, reward=reward, **kw)


def _slime_grpo(rewards: list[float], n: int, std: bool) -> list[float]:
    """slime's reference computation (torch, float32, unbiased std)."""
    r = torch.tensor(rewards, dtype=torch.float).reshape(-1, n)
    r = r - r.mean(dim=-1, keepdim=True)
    if std:
        r = r / (r.std(dim=-1, keepdim=True) + 1e-6)
    return r.flatten().tolist()


def test_masks_rewards_and_flags():
    samples = [
        _sample(1.0, group_index=0, rollout_id=7),
        _sample(0.0, loss_mask=[1, 0, 1], group_index=0, status=Sample.Status.TRUNCATED),
        _sample(0.5, remove_sample=True, loss_mask=[1, 1, 1], group_index=1),
        _sample({"acc": 2.0, "fmt": 1.0}, group_index=1),
    ]
    with pytest.raises(SampleError, match="sample 3, field 'reward'.*rewardKey"):
        to_train_data(samples)
    samples[3].reward = 2.0
    data = to_train_data(samples)
    assert data.loss_masks == [[1, 1, 1], [1, 0, 1], [0, 0, 0], [1, 1, 1]]
    assert data.response_lengths == [3, 3, 3, 3] and data.tokens[0] == [0, 1, 2, 3, 4]
    assert data.rewards == [1.0, 0.0, 0.5, 2.0]
    assert data.truncated == [False, True, False, False]
    assert data.rollout_ids == [7, None, None, None] and data.group_ids == [0, 0, 1, 1]
    assert data.rollout_log_probs is None and len(data) == 4


def test_dict_rewards_use_reward_key():
    samples = [_sample({"acc": 1.0, "fmt": 0.0}, group_index=0), _sample({"acc": 0.0, "fmt": 1.0}, group_index=0)]
    assert to_train_data(samples, reward_key="fmt").rewards == [0.0, 1.0]
    with pytest.raises(SampleError, match="sample 0, field 'reward': has no key 'nope'"):
        to_train_data(samples, reward_key="nope")


@pytest.mark.parametrize(
    "change, index, field",
    [
        (lambda s: setattr(s, "loss_mask", [1, 1]), 1, "loss_mask"),
        (lambda s: setattr(s, "loss_mask", [1, 2, 1]), 1, "loss_mask"),
        (lambda s: setattr(s, "response_length", 9), 1, "response_length"),
        (lambda s: setattr(s, "response_length", 5), 1, "response_length"),
        (lambda s: setattr(s, "reward", None), 1, "reward"),
        (lambda s: setattr(s, "reward", float("nan")), 1, "reward"),
        (lambda s: setattr(s, "tokens", []), 1, "tokens"),
        (lambda s: setattr(s, "rollout_log_probs", [0.0]), 1, "rollout_log_probs"),
        (lambda s: setattr(s, "group_index", None), 1, "group_index"),
    ],
)
def test_inconsistent_samples_name_index_and_field(change, index, field):
    samples = [_sample(group_index=0), _sample(group_index=0)]
    change(samples[index])
    with pytest.raises(SampleError) as info:
        to_train_data(samples)
    assert info.value.index == index and info.value.field == field
    assert f"sample {index}, field '{field}'" in str(info.value)


def test_log_probs_all_or_none():
    samples = [_sample(group_index=0, rollout_log_probs=[-0.1, -0.2, -0.3]), _sample(group_index=0)]
    with pytest.raises(SampleError, match="sample 1, field 'rollout_log_probs'"):
        to_train_data(samples)
    samples[1].rollout_log_probs = [-1.0, -2.0, -3.0]
    assert to_train_data(samples).rollout_log_probs == [[-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0]]


def test_grpo_matches_slime_for_consecutive_groups():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.2, 0.4, 0.9, 0.3]
    samples = [_sample(r) for r in rewards]
    for std in (True, False):
        data = to_train_data(samples, n_samples_per_prompt=4, normalize_std=std)
        assert data.advantages == pytest.approx(_slime_grpo(rewards, 4, std), abs=1e-5)
        assert data.group_ids == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(SampleError, match="do not split into groups of 3"):
        to_train_data(samples, n_samples_per_prompt=3)


def test_grpo_by_group_index_handles_interleaving():
    rewards = [1.0, 10.0, 3.0, 30.0]
    samples = [_sample(r, group_index=g) for r, g in zip(rewards, [5, 9, 5, 9])]
    data = to_train_data(samples, normalize_std=False)
    assert data.advantages == pytest.approx([-1.0, -10.0, 1.0, 10.0])
    assert data.group_ids == [0, 1, 0, 1]
    assert grpo_advantages([3.0], [0]) == [0.0]  # a group of one has no spread


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=6), st.integers(1, 4))
def test_grpo_property_groups_are_centered(group, n_groups):
    rewards = group * n_groups
    group_ids = [g for g in range(n_groups) for _ in group]
    advantages = grpo_advantages(rewards, group_ids)
    for g in range(n_groups):
        values = advantages[g * len(group) : (g + 1) * len(group)]
        assert abs(sum(values)) < 1e-6 * len(values) + 1e-9
    assert advantages == pytest.approx(_slime_grpo(rewards, len(group), True), abs=1e-3)


def test_converts_a_real_slime_dump(tmp_path):
    path = tmp_path / "rollout_0.pt"
    slime = slime_samples(n_groups=2, group_size=4, dict_rewards=True)
    save_debug_rollout_data(path, 0, slime)
    data = to_train_data(load(path).samples, n_samples_per_prompt=4, reward_key="accuracy")
    assert data.rewards == [s.reward["accuracy"] for s in slime]
    for mask, s in zip(data.loss_masks, slime):
        assert len(mask) == s.response_length
        expected = [0] * s.response_length if s.remove_sample else (s.loss_mask or [1] * s.response_length)
        assert mask == expected
    assert data.rollout_log_probs == [s.rollout_log_probs for s in slime]
    assert data.truncated == [s.status.value == "truncated" for s in slime]
