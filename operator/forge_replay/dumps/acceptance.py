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
- step-micro-batches-align (slime): each step's samples must cover the data-parallel ranks, and without
  --use-dynamic-batch-size their fixed micro-batches must divide across them.
- top-p-needs-token-ids (slime): with --rollout-top-p other than 1.0 every sample carries top-p token ids and
  offsets that fit its response.
- rollout-log-probs (slime, miles): the flags that read ``rollout_log_probs`` need them on every sample; slime also
  fails on a rollout where sample 0 has them and another has not.
- trim-to-global-batch (miles): a rollout whose samples carry no rollout_id is cut to a multiple of the global batch
  size, and none left is a ValueError.
- indep-dp-one-step (miles): with independent data-parallel cells (train fault tolerance) each cell makes exactly
  one step of a rollout.

The global batch size is the argv's (--num-steps-per-rollout, --global-batch-size), else Megatron's default
(micro-batch x data-parallel size) when the argv gives the world size (frameworks/batch.py). What the frameworks drop
without refusing (slime: the episodes past the last whole step; miles: the samples past the last whole global batch)
is said by :func:`dropped_notes`, not refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_replay.frameworks.batch import batch_layout, int_value
from forge_replay.frameworks.flags import flag_of, flag_table, flag_value, sets_flag
from forge_replay.frameworks.rules import MEGATRON, upstream_rule


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
    """Episodes (slime; miles: samples) per training step, when the argv fixes it: rollout-batch-size x
    n-samples-per-prompt // num-steps-per-rollout, else --global-batch-size, else micro-batch x data-parallel size
    when the argv gives the world size (Megatron's default)."""
    given: frozenset[str] = frozenset()  # the flags the argv sets, for rules that a flag turns on or off
    micro_batch_size: int = 1
    data_parallel_size: int | None = None
    """Megatron's data-parallel size (1 in each of miles' independent cells); None without the world size."""
    cells: int = 1
    """miles' independent data-parallel cells (train fault tolerance, --indep-dp)."""
    global_batch_from: str = ""
    """The flag ``global_batch_size`` comes from, or "default"."""
    rollout_top_p: float = 1.0

    @classmethod
    def from_args(cls, backend: str, args: Sequence[str], reward_key: str | None) -> UpstreamSettings:
        """The settings of ``backend`` given its argv ``args`` (spec.trainer.args, with the flags forge-replay injects
        where the caller has them: the world size, fault tolerance, the loader), upstream's defaults for what they
        leave out, and ``reward_key`` (spec.replay.rewardKey: forge-replay injects ``--reward-key``)."""
        options = flag_table(backend).options

        def value(flag: str) -> Any:
            given = flag_value(list(args), flag)
            return given if given is not None else options.get(flag, {}).get("default")

        layout = batch_layout(backend, args)
        try:
            top_p = float(value("--rollout-top-p") if value("--rollout-top-p") is not None else 1.0)
        except ValueError:  # the framework's parser refuses it first
            top_p = 1.0
        return cls(
            backend=backend,
            reward_key=reward_key,
            advantage_estimator=str(value("--advantage-estimator") or "grpo"),
            rewards_normalization=not sets_flag(list(args), "--disable-rewards-normalization"),
            n_samples_per_prompt=int_value(backend, args, "--n-samples-per-prompt") or 1,
            rollout_batch_size=int_value(backend, args, "--rollout-batch-size"),
            global_batch_size=layout.global_batch_size,
            given=frozenset(filter(None, map(flag_of, args))),
            micro_batch_size=layout.micro_batch_size,
            data_parallel_size=layout.data_parallel_size,
            cells=layout.cells,
            global_batch_from=layout.global_batch_from,
            rollout_top_p=top_p,
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
    for check in (_reward_key_needs_dict, _rollout_shares_reward, _enough_episodes_for_a_step, _steps_align,
                  _top_p_token_ids, _rollout_log_probs, _trim_leaves_samples, _one_step_per_cell):
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


def _episodes(samples: Sequence[Any]) -> list[list[int]]:
    """slime's episodes of a rollout, in first-occurrence order: the samples sharing a Sample.rollout_id, and each
    sample without one an episode of its own (slime gives it a fresh id)."""
    by_id: dict[Any, list[int]] = {}
    for i, s in enumerate(samples):
        by_id.setdefault(s.rollout_id if s.rollout_id is not None else ("fresh", i), []).append(i)
    return list(by_id.values())


def _batch_words(settings: UpstreamSettings) -> str:
    """Where the global batch size comes from, for messages."""
    if settings.global_batch_from == "default":
        default = upstream_rule(MEGATRON, "default-global-batch-size")
        return (f"Megatron's default, --micro-batch-size {settings.micro_batch_size} x the data-parallel size "
                f"{settings.data_parallel_size}, as neither --global-batch-size nor --num-steps-per-rollout is given: "
                f"{default.where if default else 'Megatron-LM'}")
    return f"from {settings.global_batch_from}" if settings.global_batch_from else "the global batch size"


def _steps_align(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "step-micro-batches-align")
    gbs, dp = settings.global_batch_size, settings.data_parallel_size
    if rule is None or not gbs or not dp:
        return None
    episodes = _episodes(samples)
    static = rule["off_flag"] not in settings.given and not settings.given & set(rule["vpp_flags"])
    for step in range(len(episodes) // gbs):
        members = [i for episode in episodes[step * gbs:(step + 1) * gbs] for i in episode]
        size, first = len(members), min(members)
        if size < dp:
            return Refusal(first, "rollout_id", f"step {step} of this rollout holds {size} samples ({gbs} episodes a "
                           f"step, {_batch_words(settings)}), fewer than the data-parallel size {dp}: {settings.backend} "
                           f"gives every rank at least one sample and fails an assertion ({rule.where}); raise "
                           "--global-batch-size in spec.trainer.args, or lower the GPUs")
        micro = -(-size // settings.micro_batch_size)
        if static and micro % dp:
            return Refusal(first, "rollout_id", f"step {step} of this rollout holds {size} samples ({gbs} episodes a "
                           f"step, {_batch_words(settings)}): {micro} micro-batches of --micro-batch-size "
                           f"{settings.micro_batch_size}, not a multiple of the data-parallel size {dp}, and "
                           f"{settings.backend}'s fixed micro-batches fail an assertion ({rule.where}); make the "
                           "step's samples / --micro-batch-size a multiple of it in spec.trainer.args "
                           "(--global-batch-size, --micro-batch-size), or pass --use-dynamic-batch-size")
    return None


def _top_p_token_ids(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "top-p-needs-token-ids")
    if rule is None or settings.rollout_top_p == 1.0 or settings.given & set(rule["unless_flags"]):
        return None
    flag = f"with {rule['flag']} {settings.rollout_top_p:g} (spec.trainer.args)"
    for i, s in enumerate(samples):
        ids, offsets = s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets
        for name, value in (("rollout_top_p_token_ids", ids), ("rollout_top_p_token_offsets", offsets)):
            if value is None:
                return Refusal(i, name, f"is None: {flag} {settings.backend} asserts every sample carries top-p "
                               f"token ids and offsets ({rule.where}); dump them with the rollouts, or set "
                               f"{rule['flag']} 1.0")
        problem = _top_p_shape(ids, offsets, s.response_length)
        if problem:
            return Refusal(i, "rollout_top_p_token_offsets", f"{problem}: {flag} {settings.backend} asserts the "
                           f"offsets fit the response ({rule.where})")
    return None


def _top_p_shape(ids: Any, offsets: Any, response_length: Any) -> str:
    """Why top-p ``offsets`` do not fit ``ids`` and the response, or ""."""
    try:
        if len(offsets) != response_length + 1:
            return f"has length {len(offsets)}, not response_length + 1 = {response_length + 1}"
        if int(offsets[-1]) != len(ids):
            return f"ends at {int(offsets[-1])}, not at len(rollout_top_p_token_ids) = {len(ids)}"
    except (TypeError, ValueError, IndexError):
        return f"is not a sequence of offsets ({_short(offsets)})"
    return ""


def _rollout_log_probs(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "rollout-log-probs")
    if rule is None or not samples:
        return None
    reading = [f for f in rule["flags"] if f in settings.given
               and not (f in rule["tis_flags"] and rule["custom_tis_flag"] in settings.given)]
    missing = next((i for i, s in enumerate(samples) if s.rollout_log_probs is None), None)
    if missing is None:
        return None
    if reading:
        return Refusal(missing, "rollout_log_probs", f"is None: with {' and '.join(reading)} (spec.trainer.args) "
                       f"{settings.backend} trains on every sample's rollout log probs and fails without them "
                       f"({rule.where}); dump them with the rollouts, or drop {' and '.join(reading)}")
    if rule["all_or_none"] and samples[0].rollout_log_probs is not None:
        return Refusal(missing, "rollout_log_probs", f"is None while sample 0 has rollout log probs: "
                       f"{settings.backend} then collects them from every sample and raises a TypeError on this one "
                       f"({rule.where}); give every sample its log probs, or none")
    return None


def _kept_by_trim(count: int, settings: UpstreamSettings) -> tuple[int, int] | None:
    """(global batch size, samples kept) of miles' trim of a rollout of ``count`` samples none of which has a
    rollout_id; None when the trim does not run or the batch size is not known."""
    rule = upstream_rule(settings.backend, "trim-to-global-batch")
    if rule is None or rule["off_flag"] in settings.given or "--load-debug-rollout-data" in settings.given:
        return None
    gbs = settings.global_batch_size
    if rule["dynamic_flag"] in settings.given:  # rounded down to the data-parallel size, at least it
        dp = settings.data_parallel_size if settings.cells == 1 else None
        gbs = ((count // dp) * dp or dp) if dp else None
    if not gbs:
        return None
    return gbs, count // gbs * gbs


def _trim_leaves_samples(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    if not samples or any(s.rollout_id is not None for s in samples):
        return None
    trim = _kept_by_trim(len(samples), settings)
    if trim is None or trim[1] or not len(samples) % trim[0]:
        return None
    rule = upstream_rule(settings.backend, "trim-to-global-batch")
    return Refusal(0, "rollout_id", f"no sample has one, and the rollout's {len(samples)} samples are fewer than the "
                   f"global batch size {trim[0]} ({_batch_words(settings)}): {settings.backend} cuts such a rollout "
                   f"to a multiple of it and raises a ValueError when none is left ({rule.where}); give the samples "
                   f"rollout ids, lower the global batch size in spec.trainer.args, or pass {rule['off_flag']}")


def _one_step_per_cell(samples: Sequence[Any], settings: UpstreamSettings) -> Refusal | None:
    rule = upstream_rule(settings.backend, "indep-dp-one-step")
    cells, gbs = settings.cells, settings.global_batch_size
    if rule is None or cells < 2 or not gbs or not samples or "--use-dynamic-global-batch-size" in settings.given:
        return None  # a dynamic batch size follows the trainer's own data-parallel size: not decided here
    count = len(samples)
    if not any(s.rollout_id is not None for s in samples):
        trim = _kept_by_trim(count, settings)
        if trim is not None:
            gbs, count = trim[0], trim[1] or count
    per_cell = gbs // cells
    sizes = sorted({len(range(c, count, cells)) for c in range(cells)})
    steps = sorted({size // per_cell for size in sizes}) if per_cell else []
    if steps == [1]:
        return None
    what = (f"global batch size {gbs} ({_batch_words(settings)}) over {cells} cells leaves each cell 0 samples a step "
            "(a ZeroDivisionError)" if not per_cell else
            f"{cells} cells take {'/'.join(map(str, sizes))} of its {count} samples, {per_cell} a step (the global "
            f"batch size {gbs}, {_batch_words(settings)}, over the cells): {'/'.join(map(str, steps))} step(s)")
    return Refusal(0, "rollout_id", f"with independent data-parallel cells (faultTolerance.components train, or "
                   f"--indep-dp) {settings.backend} makes exactly one optimizer step of a rollout in every cell, and "
                   f"fails an assertion otherwise ({rule.where}); {what}: give --global-batch-size {count} (the "
                   f"rollout's samples; a multiple of the {cells} cells) in spec.trainer.args, or leave train out "
                   "of faultTolerance.components")


def dropped_notes(samples: Sequence[Any], settings: UpstreamSettings) -> list[str]:
    """What ``settings.backend`` drops of ``samples`` (one train dump) without refusing it: slime the episodes past
    the last whole step, miles (trim) the samples past the last whole global batch. Empty when nothing is dropped,
    and for a rollout :func:`refusals` refuses."""
    said = []
    slime = upstream_rule(settings.backend, "trailing-episodes-dropped")
    gbs = settings.global_batch_size
    if slime is not None and gbs and samples:
        episodes = _episodes(samples)
        kept = len(episodes) // gbs * gbs
        if kept and kept < len(episodes):
            dropped = sum(len(e) for e in episodes[kept:])
            said.append(f"{settings.backend} trains {kept} of its {len(episodes)} episodes ({len(episodes) // gbs} "
                        f"step(s) of {gbs}, {_batch_words(settings)}) and drops the last {len(episodes) - kept} "
                        f"({dropped} sample(s)) without a word ({slime.where})")
    miles = upstream_rule(settings.backend, "trim-to-global-batch")
    if miles is not None and samples and not any(s.rollout_id is not None for s in samples):
        trim = _kept_by_trim(len(samples), settings)
        if trim is not None and 0 < trim[1] < len(samples):
            said.append(f"{settings.backend} trains {trim[1]} of its {len(samples)} samples (a multiple of the global "
                        f"batch size {trim[0]}, {_batch_words(settings)}) and drops the last {len(samples) - trim[1]}, "
                        f"as no sample has a rollout_id ({miles.where})")
    return said


def _reward_value(sample: Any, settings: UpstreamSettings) -> Any:
    reward = sample.reward
    if settings.reward_key and isinstance(reward, dict):
        return reward.get(settings.reward_key)
    return reward


def _short(value: Any) -> str:
    from forge_replay.dumps.bounds import quote

    return quote(value)
