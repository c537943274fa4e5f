"""The argv forge-replay appends to a slime / miles job's own: the replay flags from the spec, and the worker
group's shape. Pure functions of a validated spec (controller/render.py and the local run use them)."""

from __future__ import annotations

from typing import Any

from forge_replay.frameworks.flags import BACKENDS, UPSTREAM_FORGE_FUNCTION, sets_flag
from forge_replay.frameworks.rules import upstream_rule

ROLLOUT_FUNCTION = "forge_replay.replay.generate_rollout"
"""Our safe loader, as a slime/miles rollout (and eval) function."""


def loader_flags(mode: str, loader: str, dumps: str) -> list[str]:
    """The flags that make the trainer replay ``dumps`` (the mounted path or template)."""
    if loader == "upstream":
        if mode == "debug":
            return ["--load-debug-rollout-data", dumps]
        return ["--rollout-function-path", UPSTREAM_FORGE_FUNCTION, "--load-forge-rollout-data", dumps]
    return [
        "--rollout-function-path", ROLLOUT_FUNCTION,
        "--eval-function-path", ROLLOUT_FUNCTION,
        "--load-forge-rollout-data", dumps,
    ]  # fmt: skip


def injected_argv(spec: Any, dumps_root: str) -> list[str]:
    """The argv forge-replay appends to the team's args for a slime/miles ``spec`` (a ForgeReplayJobSpec);
    ``dumps_root`` is where the dumps claim is mounted (or the local dumps folder)."""
    backend, trainer, replay = spec.trainer.backend, spec.trainer, spec.replay
    if backend not in BACKENDS:
        raise ValueError(f"spec.trainer.backend: {backend!r} injects no flags; one of {', '.join(BACKENDS)}")
    gpus = str(trainer.gpus_per_node)
    argv = ["--actor-num-nodes", str(trainer.nodes), "--actor-num-gpus-per-node", gpus, "--num-gpus-per-node", gpus]
    rollout = spec.rollout
    if replay.mode == "forge" and rollout is not None:
        argv += ["--rollout-num-gpus", str(rollout.num_gpus)]
        argv += ["--rollout-num-gpus-per-engine", str(rollout.num_gpus_per_engine)]
        if rollout.colocate:
            argv.append("--colocate")
    if replay.mode == "debug":
        argv.append("--debug-train-only")
    argv += loader_flags(replay.mode, replay.loader, f"{dumps_root.rstrip('/')}/{replay.dumps.path}")
    if backend == "miles" and replay.loader == "forgeReplay" and not replay.dumps.fallback_to_first:
        argv.append("--no-forge-replay-fallback-to-first")
    argv += dataset_flags(backend, trainer.args)
    start = replay.start_rollout_id
    argv += ["--start-rollout-id", str(start), "--num-rollout", str(start + replay.num_rollouts)]
    if replay.eval_interval:
        argv += ["--eval-interval", str(replay.eval_interval)]
        if not replay.eval_before_train:  # slime's and miles' train.py evaluate before training unless told not to
            argv.append("--skip-eval-before-train")
    if replay.reward_key:
        argv += ["--reward-key", replay.reward_key]
    if replay.eval_reward_key:
        argv += ["--eval-reward-key", replay.eval_reward_key]
    ft = spec.fault_tolerance
    if ft.enabled:
        argv.append("--use-fault-tolerance")
        if backend == "miles":
            argv += ["--ft-components", *ft.active_components]
    return argv


def dataset_flags(backend: str, args: list[str]) -> list[str]:
    """``--disable-rollout-global-dataset`` where ``backend`` would load ``--prompt-data`` unconditionally (miles: a
    replay has no prompts), unless the team's ``args`` give prompt data or the flag themselves."""
    rule = upstream_rule(backend, "global-dataset")
    if rule is None or not rule["needs_prompt_data"]:
        return []
    if sets_flag(args, rule["data_flag"]) or sets_flag(args, rule["off_flag"]):
        return []
    return [rule["off_flag"]]


def worker_gpus(spec: Any) -> int:
    """GPUs of the one homogeneous Ray worker group: the trainer's, plus separate engines' in forge mode."""
    trainer, rollout = spec.trainer, spec.rollout
    total = trainer.nodes * trainer.gpus_per_node
    if spec.replay.mode == "forge" and rollout is not None and not rollout.colocate:
        total += rollout.num_gpus
    return total


def worker_nodes(spec: Any) -> int:
    """Pods of the worker group: whole nodes of ``gpusPerNode`` GPUs (the trainer's count on CPU)."""
    per_node = spec.trainer.gpus_per_node
    return worker_gpus(spec) // per_node if per_node else spec.trainer.nodes
