"""The batch layout a slime / miles run takes from its argv: the world size, Megatron's data-parallel size, miles'
independent data-parallel cells, the micro-batch size and the global batch size, computed as their parsers do.

Pure functions of the argv (the team's args and, where known, the flags forge-replay injects); the spec rules
(api/byo_rules.py) and verify's acceptance rules (dumps/acceptance.py) read the same numbers. The facts are rules of
``upstream_rules.json``: world-size (slime and miles), data-parallel-size and default-global-batch-size (Megatron-LM),
indep-dp-one-step (miles' cells); --num-steps-per-rollout is the steps-split-by-episode rule's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_replay.frameworks.flags import flag_of, flag_table, flag_value, sets_flag

MODEL_PARALLEL_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size")
"""Megatron's flags whose product is the GPUs of one model replica (each 1 by default; Megatron declares them, so
they are not in slime's and miles' flag tables)."""


@dataclass(frozen=True)
class BatchLayout:
    """How a run's GPUs and a rollout's samples are laid out for training."""

    world_size: int | None = None
    """--actor-num-nodes x --actor-num-gpus-per-node; None when the argv does not say."""
    model_size: int = 1
    """GPUs of one model replica: TP x PP x CP."""
    data_parallel_size: int | None = None
    """Megatron's data-parallel size: world_size // model_size (1 in each of miles' independent cells)."""
    cells: int = 1
    """miles' independent data-parallel cells (--ft-components train or --indep-dp): world_size // model_size."""
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    """Samples (slime: episodes) a training step takes; None when neither the argv nor a known world size fix it."""
    global_batch_from: str = ""
    """Where ``global_batch_size`` comes from: a flag of the argv, or "default" (micro-batch x data-parallel)."""


def int_value(backend: str, args: Sequence[str], flag: str) -> int | None:
    """The integer ``args`` give ``flag``, else the flag table's default; None when neither is an integer (the
    framework's parser refuses a bad value before anything that reads it)."""
    raw = flag_value(list(args), flag)
    if raw is None:
        raw = flag_table(backend).options.get(flag, {}).get("default")
    try:
        return int(raw) if raw is not None and not isinstance(raw, bool) else None
    except ValueError:
        return None


def flag_values(args: Sequence[str], flag: str) -> list[str]:
    """The values of a flag that takes several (``--f a b`` up to the next flag, or ``--f=a``), the last given."""
    values: list[str] | None = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            values = [arg.split("=", 1)[1]]
        elif arg == flag:
            values = []
            for item in args[i + 1:]:
                if flag_of(item) is not None:
                    break
                values.append(item)
    return values or []


def independent_cells(backend: str, args: Sequence[str]) -> bool:
    """Whether miles runs independent data-parallel cells: --indep-dp, or --use-fault-tolerance with train among
    --ft-components (rule indep-dp-one-step). Never for slime."""
    if backend != "miles":
        return False
    return sets_flag(list(args), "--indep-dp") or (
        sets_flag(list(args), "--use-fault-tolerance") and "train" in flag_values(args, "--ft-components"))


def batch_layout(backend: str, args: Sequence[str], world_size: int | None = None,
                 cells: bool | None = None) -> BatchLayout:
    """The layout of ``backend`` for ``args``. ``world_size`` (nodes x GPUs per node) defaults to what the argv's
    --actor-num-nodes and --actor-num-gpus-per-node say; ``cells`` (independent data parallelism) to
    :func:`independent_cells`."""
    if world_size is None:  # only what the argv says: the tables' defaults are not the job's GPUs
        nodes, gpus = (_given_int(args, flag) for flag in ("--actor-num-nodes", "--actor-num-gpus-per-node"))
        world_size = nodes * gpus if nodes is not None and gpus is not None else None
    if cells is None:
        cells = independent_cells(backend, args)
    model_size = 1
    for flag in MODEL_PARALLEL_FLAGS:
        model_size *= max(1, int_value(backend, args, flag) or 1)
    replicas = world_size // model_size if world_size else None
    data_parallel_size = (1 if replicas else None) if cells else replicas
    micro_batch_size = max(1, int_value(backend, args, "--micro-batch-size") or 1)
    rollout_batch_size = int_value(backend, args, "--rollout-batch-size")
    n_samples_per_prompt = int_value(backend, args, "--n-samples-per-prompt") or 1
    steps, given = int_value(backend, args, "--num-steps-per-rollout"), int_value(backend, args, "--global-batch-size")
    if steps and rollout_batch_size:  # slime/utils/arguments.py:1971-1979, miles/utils/arguments.py:3431-3439
        global_batch_size, source = rollout_batch_size * n_samples_per_prompt // steps, "--num-steps-per-rollout"
    elif given:
        global_batch_size, source = given, "--global-batch-size"
    elif data_parallel_size and not _fsdp(backend, args):  # Megatron-LM arguments.py:497-498
        global_batch_size, source = micro_batch_size * data_parallel_size, "default"
    else:
        global_batch_size, source = None, ""
    return BatchLayout(world_size, model_size, data_parallel_size, (replicas or 1) if cells else 1,
                       micro_batch_size, global_batch_size, source)


def _given_int(args: Sequence[str], flag: str) -> int | None:
    raw = flag_value(list(args), flag)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _fsdp(backend: str, args: Sequence[str]) -> bool:
    """miles' FSDP trainer does not run Megatron's argument checks (so no default global batch size)."""
    return backend == "miles" and flag_value(list(args), "--train-backend") == "fsdp"


def verify_flags(spec: Any, dumps: str) -> list[str]:
    """The flags forge-replay injects for a slime / miles ``spec`` (a ForgeReplayJobSpec) that verify's acceptance
    rules read besides the team's args: the world size, fault tolerance (miles' cells) and the upstream debug loader
    (miles skips its trim there). Each is what backends.argv.injected_argv appends, with the same values (a test
    checks); ``dumps`` is the dumps path or template the loader is given."""
    trainer, replay, ft = spec.trainer, spec.replay, spec.fault_tolerance
    flags = ["--actor-num-nodes", str(trainer.nodes), "--actor-num-gpus-per-node", str(trainer.gpus_per_node)]
    if replay.mode == "debug" and replay.loader == "upstream":
        flags += ["--debug-train-only", "--load-debug-rollout-data", dumps]
    if ft.enabled:
        flags.append("--use-fault-tolerance")
        if trainer.backend == "miles":
            flags += ["--ft-components", *ft.active_components]
    return flags
