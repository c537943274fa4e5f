"""Bring your own trainer (slime, miles): the flag tables read from upstream and the argv the operator injects.

Pure functions over a validated spec; nothing here imports pydantic, Ray or the framework. The flag tables
(``slime_flags.json``, ``miles_flags.json``) are written by ``scripts/backend-flags`` from the upstream
``arguments.py`` at the commit each file records; a test checks every flag injected here is in its table. What
their code refuses, skips or falls back on beyond the flag tables is in ``upstream_rules.json`` (``rules.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

BACKENDS = ("slime", "miles")
"""Foreign trainers: the team's own image and script, replay flags injected (``builtin`` is ours)."""

ROLLOUT_FUNCTION = "forge_replay.replay.generate_rollout"
"""Our safe loader, as a slime/miles rollout (and eval) function."""

UPSTREAM_FORGE_FUNCTION = "slime.rollout.forge_load.generate_rollout"
"""slime's own forge loader (unpickles with torch.load(weights_only=False)); miles has none."""

FALLBACK_FLAGS = ("--forge-replay-fallback-to-first", "--no-forge-replay-fallback-to-first")
"""Our loader's switch for spec.replay.dumps.fallbackToFirst (miles only: slime drops undeclared flags)."""

OWN_FLAGS = ("--load-forge-rollout-data", *FALLBACK_FLAGS)
"""Flags our rollout function's ``add_arguments`` adds to a parser that lacks them (miles has none of these)."""

INJECTED_FLAGS = (
    "--actor-num-nodes", "--actor-num-gpus-per-node", "--num-gpus-per-node",
    "--rollout-num-gpus", "--rollout-num-gpus-per-engine", "--colocate",
    "--rollout-function-path", "--eval-function-path", "--load-forge-rollout-data",
    "--debug-train-only", "--load-debug-rollout-data",
    "--start-rollout-id", "--num-rollout", "--eval-interval", "--skip-eval-before-train", "--reward-key",
    "--eval-reward-key", "--use-fault-tolerance",
)  # fmt: skip
"""Every flag the operator may inject for either backend (``--ft-components`` too, for miles)."""

BACKEND_INJECTED = {"slime": INJECTED_FLAGS, "miles": (*INJECTED_FLAGS, "--ft-components", *FALLBACK_FLAGS)}

INJECTED_UNLESS_GIVEN = ("--disable-rollout-global-dataset",)
"""Flags injected unless the team's args decide (rule global-dataset of upstream_rules.json): not refused in args."""

REFUSED_FLAGS = {
    "slime": ("--num-epoch", "--dump-details", "--save-debug-rollout-data"),
    "miles": (
        "--num-epoch", "--dump-details", "--save-debug-rollout-data",
        "--fully-async", "--ci-inject-rollout-data-path",
    ),
}  # fmt: skip
"""Flags the team's args may not set although we do not inject them, per backend."""

_REFUSED_WHY = {
    "--num-epoch": "replay runs exactly the rollouts the spec names (--start-rollout-id and --num-rollout)",
    "--dump-details": "it writes under the dumps, which are mounted read-only",
    "--save-debug-rollout-data": "it writes dumps, which are mounted read-only",
    "--fully-async": "miles' fully async rollout generates instead of replaying",
    "--ci-inject-rollout-data-path": "miles' CI injection replaces rollouts behind the replay's back",
}


@dataclass(frozen=True)
class FlagTable:
    """One backend's options as its upstream arguments.py declares them."""

    backend: str
    repository: str
    commit: str
    file: str
    options: dict[str, dict[str, Any]]

    def has(self, flag: str) -> bool:
        """Whether ``flag`` (``--name``) is declared, as an option string or an alias."""
        return flag in self.options or any(flag in row.get("aliases", ()) for row in self.options.values())


@lru_cache(maxsize=None)
def flag_table(backend: str) -> FlagTable:
    """The committed flag table of ``backend`` (slime or miles)."""
    if backend not in BACKENDS:
        raise ValueError(f"no flag table for backend {backend!r}; one of {', '.join(BACKENDS)}")
    data = json.loads((Path(__file__).parent / f"{backend}_flags.json").read_text(encoding="utf-8"))
    return FlagTable(data["backend"], data["repository"], data["commit"], data["file"], data["options"])


def required_flags(backend: str) -> list[str]:
    """The flags ``backend``'s parser requires (``required=True`` in its arguments.py), sorted."""
    return sorted(flag for flag, row in flag_table(backend).options.items() if row.get("required"))


def missing_required(backend: str, args: list[str]) -> list[str]:
    """The required flags of ``backend`` that neither the team's ``args`` nor forge-replay's injected flags give."""
    from forge_replay.backends.rules import sets_flag

    return [flag for flag in required_flags(backend) if flag not in BACKEND_INJECTED[backend]
            and not sets_flag(args, flag)]


def flag_of(arg: str) -> str | None:
    """The option an argv item sets (``--f`` of ``--f`` or ``--f=v``); None for a value."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg.split("=", 1)[0]


def arg_problems(backend: str, args: list[str]) -> list[tuple[int, str]]:
    """(index, message) for each item of the team's ``args`` that sets a flag the operator owns or refuses."""
    problems: list[tuple[int, str]] = []
    injected, refused = BACKEND_INJECTED[backend], REFUSED_FLAGS[backend]
    for index, arg in enumerate(args):
        flag = flag_of(arg)
        if flag in injected:
            problems.append((index, f"{flag} is set by forge-replay from the spec; remove it from args"))
        elif flag in refused:
            problems.append((index, f"{flag} cannot be used in a replay: {_REFUSED_WHY[flag]}"))
    return problems


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
    from forge_replay.backends.rules import sets_flag, upstream_rule

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
