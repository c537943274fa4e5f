"""What a run evaluates: which eval dumps it replays (the schedule) and how their rewards are read.

Eval N reads the dump ``eval_N``. After rollout N when ``(N + 1) % eval_interval == 0``, as slime; before the first
step too when ``spec.replay.evalBeforeTrain`` asks for it, where the trainer's train.py evaluates it. The replay
(:mod:`forge_replay.replay`), the runtime's driver, verify and `forge-replay run`'s synthetic dumps all read the
schedule here, so they agree on which eval dumps a run needs.
"""

from __future__ import annotations

from typing import Any

from forge_replay.frameworks.rules import upstream_rule


def eval_rollout_ids(start_rollout_id: int, num_rollouts: int, eval_interval: int) -> list[int]:
    """Rollout ids after which eval N runs (reading ``eval_N``): ``(N + 1) % eval_interval == 0``, as slime."""
    if eval_interval <= 0:
        return []
    return [n for n in range(start_rollout_id, start_rollout_id + num_rollouts) if (n + 1) % eval_interval == 0]


def eval_before_train_id(start_rollout_id: int, eval_interval: int, eval_before_train: bool,
                         backend: str = "builtin") -> int | None:
    """The eval replayed before the first training step (its id N: it reads ``eval_N``), or None.

    slime's train.py evaluates before training when eval is on (an eval interval), the loop's rollout is 0 and
    --skip-eval-before-train is not given, so a run that starts at a later rollout does not; miles' train.py
    evaluates before the run's first step, at ``start_rollout_id`` (rule eval-before-train of
    frameworks/upstream_rules.json). The builtin trainer does as slime does. forge-replay asks for it with
    ``spec.replay.evalBeforeTrain``."""
    if not eval_before_train or eval_interval <= 0:
        return None
    if backend != "builtin":
        rule = upstream_rule(backend, "eval-before-train")
        if rule is not None and rule["at"] == "start-rollout-id":
            return start_rollout_id
    return 0 if start_rollout_id == 0 else None


def replayed_eval_ids(start_rollout_id: int, num_rollouts: int, eval_interval: int, eval_before_train: bool,
                      backend: str = "builtin") -> list[int]:
    """Every eval a run replays, in order: the one before the first step (when asked for, where ``backend``'s
    train.py evaluates it) and those after rollouts."""
    first = eval_before_train_id(start_rollout_id, eval_interval, eval_before_train, backend)
    after = eval_rollout_ids(start_rollout_id, num_rollouts, eval_interval)
    return sorted(set(after) | ({first} if first is not None else set()))


def eval_note(mode: str, eval_interval: int, eval_ids: list[int], before_train: int | None) -> str:
    """One line saying which evals a run replays; in debug mode also that it evaluates only because asked."""
    if eval_interval <= 0:
        return f"{mode} mode: no eval (evalInterval 0)" + (
            "; slime's debug mode (--debug-train-only) never evaluates either" if mode == "debug" else "")
    files = ([f"eval_{before_train} before the first step"] if before_train is not None else []) + [
        f"eval_{n} after rollout {n}" for n in eval_ids]
    what = ", ".join(files) if files else "none in these rollouts"
    if mode == "debug":
        return (f"debug mode evaluates because evalInterval is {eval_interval} (slime's debug mode would not): "
                f"{what}, rewards read from the eval dumps, no engines")
    return f"eval every {eval_interval} rollouts: {what}"


def eval_rewards(samples: list[Any], reward_key: str | None) -> list[float]:
    """slime's forge_load eval rewards: ``reward[key]`` for dict rewards when a key is set, None -> 0.0."""
    rewards = []
    for i, sample in enumerate(samples):
        reward = sample.reward
        if isinstance(reward, dict) and reward_key:
            if reward_key not in reward:
                raise KeyError(f"eval sample {i}: reward has no key {reward_key!r} (keys {sorted(map(str, reward))})")
            reward = reward[reward_key]
        if isinstance(reward, dict):
            raise TypeError(f"eval sample {i}: reward is a dict (keys {sorted(map(str, reward))}); set the eval reward key")
        rewards.append(0.0 if reward is None else float(reward))
    return rewards
