"""Samples -> training data: masks, rewards, GRPO advantages (checked against torch), errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_replay.dumps import Sample, SampleError, load, save
from forge_replay.dumps.convert import Conversion, check_samples, grpo_advantages, to_train_data
from forge_replay.dumps.verify import verify_dumps
from tests.unit.test_dumps_slime_format import save_debug_rollout_data, slime_samples


def _sample(reward=1.0, response_length=3, prompt_len=2, **kw):
    return Sample(tokens=list(range(prompt_len + response_length)), response_length=response_length, reward=reward, **kw)


def _slime_grpo(rewards: list[float], n: int, std: bool, dtype: torch.dtype = torch.float) -> list[float]:
    """slime's reference computation (torch, float32 as slime runs it, unbiased std)."""
    r = torch.tensor(rewards, dtype=dtype).reshape(-1, n)
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
    # float64 reference: in float32 a constant group's mean can miss its members by one ulp, and dividing that
    # by (std + 1e-6) turns the rounding into advantages of ~0.03 (hypothesis found [0.489029929532002] * 3).
    assert advantages == pytest.approx(_slime_grpo(rewards, len(group), True, torch.double), abs=1e-3)


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


# --- garbage that used to train silently (issue 19) -----------------------------------------------

GARBAGE = {
    "float token": (lambda s: setattr(s, "tokens", [0, 1.0, 2, 3, 4]), "tokens", "token 1 is 1.0 (float)"),
    "bool token": (lambda s: setattr(s, "tokens", [0, 1, True, 3, 4]), "tokens", "token 2 is True (bool)"),
    "digit-string token": (lambda s: setattr(s, "tokens", [0, 1, 2, "3", 4]), "tokens", "token 3 is '3' (str)"),
    "float tensor tokens": (lambda s: setattr(s, "tokens", torch.arange(5.0)), "tokens", "token 0 is 0.0 (float)"),
    "token 2**70": (lambda s: setattr(s, "tokens", [0, 1, 2, 3, 2**70]), "tokens", "token 4 is 1180591620717411303424"),
    "negative token": (lambda s: setattr(s, "tokens", [0, -1, 2, 3, 4]), "tokens", "token 1 is -1"),
    "nan log prob": (lambda s: setattr(s, "rollout_log_probs", [-0.1, float("nan"), -0.3]), "rollout_log_probs", "value 1 is nan"),
    "+1e30 log prob": (lambda s: setattr(s, "rollout_log_probs", [1e30, -0.2, -0.3]), "rollout_log_probs", "value 0 is 1e+30"),
    "-1e30 log prob": (lambda s: setattr(s, "rollout_log_probs", [-0.1, -0.2, -1e30]), "rollout_log_probs", "value 2 is -1e+30"),
    "log prob 10**400": (lambda s: setattr(s, "rollout_log_probs", [-0.1, -0.2, 10**400]), "rollout_log_probs",
                         "value 2 is 1000000"),
    "string log prob": (lambda s: setattr(s, "rollout_log_probs", [-0.1, "x", -0.3]), "rollout_log_probs", "value 1 is 'x'"),
    "reward 10**400": (lambda s: setattr(s, "reward", 10**400), "reward", "is not a finite number"),
    "reward inf": (lambda s: setattr(s, "reward", float("inf")), "reward", "inf is not a finite number"),
    "bool reward": (lambda s: setattr(s, "reward", True), "reward", "True is not a finite number"),
    "mask of 2.0": (lambda s: setattr(s, "loss_mask", [1, 2.0, 1]), "loss_mask", "holds 2.0"),
    "rollout_id str": (lambda s: setattr(s, "rollout_id", "7"), "rollout_id", "'7' is not an int or None"),
}


@pytest.mark.parametrize("change, field, problem", GARBAGE.values(), ids=GARBAGE)
def test_garbage_is_refused_naming_sample_and_field(change, field, problem):
    samples = [_sample(group_index=0, rollout_log_probs=[-0.1, -0.2, -0.3]) for _ in range(3)]
    change(samples[1])
    for check in (to_train_data, check_samples):
        with pytest.raises(SampleError) as info:
            check(samples)
        assert info.value.index == 1 and info.value.field == field, check
        assert problem in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("rewards", [[1e308, 1e308], [1e308, -1e308], [-1e308, 5.0]])
def test_rewards_that_overflow_normalization_are_refused(rewards):
    samples = [_sample(r, group_index=0) for r in rewards] + [_sample(0.5, group_index=1), _sample(0.0, group_index=1)]
    with pytest.raises(SampleError, match=r"sample 0, field 'reward': the rewards of its group .* overflow"):
        to_train_data(samples)
    samples[0].reward, samples[1].reward = 1e100, 0.0  # large but normalizable: trained as given
    assert all(math.isfinite(a) for a in to_train_data(samples).advantages)


def test_all_zero_loss_masks_are_counted_and_a_rollout_of_them_is_refused():
    samples = [_sample(group_index=0, loss_mask=[0, 0, 0]), _sample(group_index=0), _sample(group_index=0, remove_sample=True)]
    assert to_train_data(samples).masked_out == 2 and check_samples(samples) == 2
    samples[1].loss_mask = [0, 0, 0]
    for check in (to_train_data, check_samples):
        with pytest.raises(SampleError, match="all 3 samples have an all-zero loss mask: nothing to train on"):
            check(samples)


def test_verify_refuses_garbage_and_counts_what_slime_accepts(tmp_path):
    good = [_sample(group_index=0, rollout_log_probs=[-0.1, -0.2, -0.3]) for _ in range(2)]
    save(tmp_path / "r_0.pt", 0, good)
    save(tmp_path / "r_1.pt", 7, good)  # inner rollout_id 7 in rollout 1's file: slime ignores it
    masked = [_sample(group_index=0, loss_mask=[0, 0, 0]), _sample(group_index=0)]
    save(tmp_path / "r_2.pt", 2, masked)
    garbage = [_sample(group_index=0, rollout_log_probs=[-0.1, -0.2, -0.3]) for _ in range(2)]
    garbage[1].rollout_log_probs[2] = float("nan")
    save(tmp_path / "r_3.pt", 3, garbage)
    report = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 5)
    statuses = [(c.rollout_id, c.status) for c in report.checks]
    assert statuses == [(0, "ok"), (1, "ok"), (2, "ok"), (3, "unreadable"), (4, "fallback")]
    bad = report.checks[3].message
    assert str(tmp_path / "r_3.pt") in bad and "sample 1, field 'rollout_log_probs'" in bad and "nan" in bad
    assert report.checks[1].rollout_id_mismatch and "rollout_id is 7, its file stands for rollout 1" in report.checks[1].message
    assert not report.checks[4].rollout_id_mismatch  # the fallback reads rollout 0's own file
    assert report.rollout_id_mismatches == 1 and report.masked_out == 1
    summary = report.to_dict()
    assert summary["rollout_id_mismatches"] == 1 and summary["masked_out_samples"] == 1 and not summary["ok"]
    assert "1 rollout_id mismatch(es); 1 sample(s) with an all-zero loss mask" in report.summary()
    literal = verify_dumps(str(tmp_path), "r_1.pt", 3)  # a literal path stands for every rollout: no mismatch
    assert literal.ok and literal.rollout_id_mismatches == 0


def test_verify_reads_rewards_under_the_job_keys(tmp_path):
    """With the job's keys (`forge-replay run`), a dict reward without replay.rewardKey is refused; eval dumps are read
    under evalRewardKey (slime reports eval rewards under their own key)."""
    train = [_sample({"acc": 1.0}, group_index=0), _sample({"acc": 0.0}, group_index=0)]
    save(tmp_path / "r_0.pt", 0, train)
    save(tmp_path / "r_eval_0.pt", 0, [_sample({"pass": 1.0})])
    assert verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1).ok  # the key is not known: dict rewards pass
    keyless = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1, conversion=Conversion())
    assert not keyless.ok and "sample 0, field 'reward': is a dict (keys ['acc']); set replay.rewardKey" in (
        keyless.checks[0].message)
    both = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1, eval_interval=1, conversion=Conversion(reward_key="acc"),
                        eval_reward_key="pass")
    assert both.ok, both.summary()
    train_key_for_eval = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1, eval_interval=1,
                                      conversion=Conversion(reward_key="acc"))
    (problem,) = train_key_for_eval.problems
    assert problem.kind == "eval" and "eval sample 0: reward has no key 'acc'" in problem.message
    # eval reads rewards as the run reports them: None is 0.0 and loss masks do not matter; NaN is refused
    save(tmp_path / "r_eval_0.pt", 0, [_sample(None, loss_mask=[0, 0, 0]), _sample({"pass": 0.5})])
    assert verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1, eval_interval=1, eval_reward_key="pass").ok
    save(tmp_path / "r_eval_0.pt", 0, [_sample(1.0), _sample(float("nan"))])
    (problem,) = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 1, eval_interval=1).problems
    assert "eval sample 1: reward nan is not a finite number" in problem.message


def test_verify_cli_takes_the_job_reward_keys(tmp_path):
    """`dumps verify` takes the job's keys: --no-reward-key refuses dict rewards, --eval-reward-key reads eval dumps."""
    from click.testing import CliRunner

    from forge_replay.cli import main

    save(tmp_path / "r_0.pt", 0, [_sample({"acc": 1.0}, group_index=0), _sample({"acc": 0.0}, group_index=0)])
    save(tmp_path / "r_eval_0.pt", 0, [_sample({"pass": 1.0})])

    def verify(*flags):
        return CliRunner().invoke(main, ["dumps", "verify", "--root", str(tmp_path), "--path", "r_{rollout_id}.pt",
                                         "--num-rollouts", "1", "--eval-interval", "1", *flags])

    assert verify().exit_code == 0  # keys unknown: dict rewards pass
    keyless = verify("--no-reward-key")
    assert keyless.exit_code == 1 and "sample 0, field 'reward': is a dict (keys ['acc'])" in keyless.output
    assert verify("--reward-key", "acc").exit_code == 1  # the eval dump has no 'acc'
    assert verify("--reward-key", "acc", "--eval-reward-key", "pass").exit_code == 0
    assert verify("--reward-key", "acc", "--no-reward-key").exit_code == 2
