"""Dumps slime or miles itself would refuse to train on, found by verify before any GPU is requested.

forge-replay's own conversion (dumps/convert.py) is what the builtin trainer accepts. slime and miles are stricter
in places; those places are rules of ``upstream_rules.json`` (each citing the upstream lines), and the checks here
apply them to a train dump's samples under the settings the team's run has (``UpstreamSettings``, read from
``spec.trainer.args`` with the flag table's defaults):

- reward-key-needs-dict (slime, miles): with ``--reward-key`` every reward is indexed by the key, so a reward that
  is not a dict is a TypeError upstream (forge-replay's trainer would train on the number).
- rollout-shares-reward (miles): in one reward group, the samples of one rollout (the same ``Sample.rollout_id``,
  else the same ``index``) must carry one reward (GRPO-like estimators with rewards normalization, and no custom
  conversion or reward post-processing in the args).
- steps-split-by-episode (slime): training steps are split by episode (``Sample.rollout_id``; one without gets a
  fresh id), ``global_batch_size`` episodes a step; a rollout with fewer episodes fails an assertion once the GPUs
  are up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_replay.frameworks.flags import flag_of, flag_table, flag_value, sets_flag
from forge_replay.frameworks.rules import upstream_rule


@dataclass(frozen=True)
class UpstreamSettings:
    """What a slime / miles run's acceptance of a rollout depends on."""

    backend: str
    reward_key: str | None = None
    advantage_estimator: str = "grpo"
    rewards_normalization: bool = True
    n_samples_per_prompt: int = 1
    rollout_batch_size: int | None = None
    global_batch_size: int | None = None
    """Episodes per training step, when the args fix it (slime: rollout-batch-size x n-samples-per-prompt //
    num-steps-per-rollout, else --global-batch-size)."""
    given: frozenset[str] = frozenset()  # the flags the team's args set, for rules that a flag turns off

    @classmethod
    def from_args(cls, backend: str, args: Sequence[str], reward_key: str | None) -> UpstreamSettings:
        """The settings of ``backend`` given the team's ``args`` (spec.trainer.args), upstream's defaults for what
        they leave out, and ``reward_key`` (spec.replay.rewardKey: forge-replay injects ``--reward-key``)."""
        options = flag_table(backend).options

        def value(flag: str) -> Any:
            given = flag_value(list(args), flag)
            return given if given is not None else options.get(flag, {}).get("default")

        def integer(flag: str) -> int | None:
            raw = value(flag)
            try:
                return int(raw) if raw is not None else None
            except ValueError:  # the framework's parser refuses it first
                return None

        n_samples_per_prompt = integer("--n-samples-per-prompt") or 1
        rollout_batch_size = integer("--rollout-batch-size")
        steps, global_batch_size = integer("--num-steps-per-rollout"), integer("--global-batch-size")
        if steps and rollout_batch_size:  # slime/utils/arguments.py (the steps-split-by-episode rule's cites)
            global_batch_size = rollout_batch_size * n_samples_per_prompt // steps
        return cls(
            backend=backend,
            reward_key=reward_key,
            advantage_estimator=str(value("--advantage-estimator") or "grpo"),
            rewards_normalization=not sets_flag(list(args), "--disable-rewards-normalization"),
            n_samples_per_prompt=n_samples_per_prompt,
            rollout_batch_size=rollout_batch_size,
            global_batch_size=global_batch_size,
            given=frozenset(filter(None, map(flag_of, args))),
        )


@dataclass(frozen=True)
class Refusal:
    """One sample the framework would refuse: its index, field and why (citing upstream)."""

    index: int
    field: str
    problem: str


def refusals(samples: Sequence[Any], settings: UpstreamSettings) -> list[Refusal]:
    """Why ``settings.backend`` would refuse to train on ``samples`` (one train dump), first problem per rule."""
    found: list[Refusal] = []
    for check in (_reward_key_needs_dict, _rollout_shares_reward, _enough_episodes_for_a_step):
        refusal = check(samples, settings)
        if refusal is not None:
            found.append(refusal)
    return found


def _reward_key_needs_dict(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "reward-key-needs-dict")
    if rule is None or not settings.reward_key:
        return None
    for i, sample in enumerate(samples):
        if not isinstance(sample.reward, dict):
            return Refusal(i, "reward", f"is {_short(sample.reward)}, not a dict: with --reward-key "
                           f"{settings.reward_key} (spec.replay.rewardKey) {settings.backend} indexes every reward by "
                           f"the key and raises a TypeError ({rule.where})")
    return None


def _groups(samples: Sequence[Any], settings: UpstreamSettings) -> list[list[int]]:
    """miles' reward groups: by group_index when every sample has one; else n-samples-per-prompt consecutive samples
    when the rollout holds exactly n-samples-per-prompt x rollout-batch-size; else one group."""
    group_indices = [s.group_index for s in samples]
    if all(g is not None for g in group_indices):
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(group_indices):
            by_group.setdefault(int(g), []).append(i)
        return list(by_group.values())
    n = settings.n_samples_per_prompt
    if settings.rollout_batch_size is not None and len(samples) == n * settings.rollout_batch_size:
        return [list(range(start, start + n)) for start in range(0, len(samples), n)]
    return [list(range(len(samples)))]


def _rollout_shares_reward(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "rollout-shares-reward")
    if rule is None or settings.advantage_estimator not in rule["estimators"] or not settings.rewards_normalization:
        return None
    if settings.given & set(rule["unless_flags"]):  # the team's own conversion decides
        return None
    for group in _groups(samples, settings):
        first: dict[Any, int] = {}
        for i in group:
            s = samples[i]
            key = s.rollout_id if s.rollout_id is not None else s.index if s.index is not None else ("row", i)
            j = first.setdefault(key, i)
            if j != i and _reward_value(s, settings) != _reward_value(samples[j], settings):
                what = (f"rollout_id {key}" if s.rollout_id is not None
                        else f"index {key}" if s.index is not None else "no rollout_id, no index")
                return Refusal(i, "reward", f"{_short(_reward_value(s, settings))} differs from sample {j}'s "
                               f"{_short(_reward_value(samples[j], settings))}, in the same group and the same "
                               f"rollout ({what}): {settings.backend} requires the samples of one rollout to share one "
                               f"reward and raises a ValueError ({rule.where}); give each sample its own rollout_id "
                               "(or None), or use backend builtin")
    return None


def _enough_episodes_for_a_step(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "steps-split-by-episode")
    if rule is None or not settings.global_batch_size or not samples:
        return None
    counts = Counter(s.rollout_id for s in samples if s.rollout_id is not None)
    episodes = len(counts) + sum(1 for s in samples if s.rollout_id is None)
    if episodes >= settings.global_batch_size:
        return None
    shared, times = counts.most_common(1)[0] if counts else (None, 0)
    why = f" ({times} samples share rollout_id {shared})" if times > 1 else ""
    return Refusal(0, "rollout_id", f"{len(samples)} samples hold {episodes} episode(s){why}, fewer than the "
                   f"{settings.global_batch_size} a training step takes (the global batch size): {settings.backend} "
                   f"splits steps by Sample.rollout_id and fails an assertion ({rule.where}); give each sample its "
                   "own rollout_id (or None), as slime's data source does")


def _reward_value(sample: Any, settings: UpstreamSettings) -> Any:
    reward = sample.reward
    if settings.reward_key and isinstance(reward, dict):
        return reward.get(settings.reward_key)
    return reward


def _short(value: Any) -> str:
    from forge_replay.dumps.bounds import quote

    return quote(value)
