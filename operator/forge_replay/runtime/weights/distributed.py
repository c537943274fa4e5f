"""Weights pushed through a process group: sglang's distributed path (buckets, the group, NCCL/gloo).

The distributed path is what slime and miles use when the engines have their own GPUs: trainer rank 0
and every engine TP rank form one extra process group (``/init_weights_update_group``: rank 0 is the
trainer, engine ``i``'s TP ranks follow from its ``rank_offset``); after each step, for every bucket of
parameters the engines are told names, dtypes and shapes (``/update_weights_from_distributed``) and
receive the tensors by broadcast from rank 0. NCCL on GPUs, gloo on CPU (how it is tested here).

HTTP calls to engines stay in the fleet (the rollout manager's node may be the only one that reaches an
engine on loopback); the trainer only joins the group and broadcasts. :class:`.sync.EngineWeightSync` is
the driver's shell that runs both sides at once and fails fast on the first error.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 * 1024**2
"""Bytes broadcast per ``/update_weights_from_distributed`` request (slime's default bucket size)."""

GROUP_NAME_PREFIX = "forge-replay-weights"
BUCKET_BYTES_ENV = "FORGE_REPLAY_WEIGHT_BUCKET_BYTES"


@dataclass(frozen=True)
class ParamMeta:
    """One parameter as the engines receive it: its checkpoint name, full shape and the dtype sent."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """A torch dtype name without the ``torch.`` prefix (``bfloat16``), as sglang's request takes it."""
    nbytes: int


def plan_buckets(params: Sequence[ParamMeta], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[ParamMeta]]:
    """Split ``params`` (order kept) into buckets of at most ``bucket_bytes``; a larger parameter is a bucket alone."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
    buckets: list[list[ParamMeta]] = []
    current: list[ParamMeta] = []
    size = 0
    for param in params:
        if current and size + param.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(param)
        size += param.nbytes
    if current:
        buckets.append(current)
    return buckets


def bucket_bytes_from_env() -> int:
    """``$FORGE_REPLAY_WEIGHT_BUCKET_BYTES`` (smaller buckets: less transfer memory, more requests), else 512 MiB."""
    import os

    raw = os.environ.get(BUCKET_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_BUCKET_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${BUCKET_BYTES_ENV} must be a positive number of bytes, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class WeightGroup:
    """The process group of one weight-sync generation: trainer rank 0 plus every engine TP rank."""

    master_address: str
    master_port: int
    group_name: str
    backend: str
    rank_offsets: tuple[int, ...]
    """Engine ``i``'s first rank in the group (its TP rank ``j`` is ``rank_offsets[i] + j``)."""
    world_size: int


def plan_weight_group(
    master_address: str, master_port: int, tp_sizes: Sequence[int], backend: str, generation: int
) -> WeightGroup:
    """The group for engines of TP sizes ``tp_sizes``: rank 0 is the trainer, engines follow in order.

    ``generation`` names the group: a new one is formed whenever an engine was restarted (a dead member
    breaks a NCCL communicator for good)."""
    if not tp_sizes or any(size < 1 for size in tp_sizes):
        raise ValueError(f"every engine needs a TP size >= 1, got {list(tp_sizes)}")
    offsets, next_rank = [], 1
    for size in tp_sizes:
        offsets.append(next_rank)
        next_rank += size
    return WeightGroup(master_address, master_port, f"{GROUP_NAME_PREFIX}-{generation}", backend,
                       tuple(offsets), next_rank)


def init_group_body(group: WeightGroup, engine: int) -> dict:
    """The ``/init_weights_update_group`` request for engine ``engine``."""
    return {
        "master_address": group.master_address,
        "master_port": group.master_port,
        "rank_offset": group.rank_offsets[engine],
        "world_size": group.world_size,
        "group_name": group.group_name,
        "backend": group.backend,
    }


def distributed_update_body(bucket: Sequence[ParamMeta], group_name: str, version: str | None) -> dict:
    """The ``/update_weights_from_distributed`` request for one bucket; ``version`` only on the last
    bucket, so an engine reports the new version only once every bucket has arrived."""
    return {
        "names": [p.name for p in bucket],
        "dtypes": [p.dtype for p in bucket],
        "shapes": [list(p.shape) for p in bucket],
        "group_name": group_name,
        "flush_cache": version is not None,
        "weight_version": version,
    }


def join_weight_group(group: WeightGroup, rank: int, timeout_s: float):
    """Join ``group`` as ``rank`` (trainer rank 0 calls this) and return the process group.

    The group is independent of the trainer's own (FSDP) group: it gets its own TCP store under its
    name, the way sglang's engines build theirs, so both sides meet on the same keys."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(
        f"tcp://{group.master_address}:{group.master_port}", rank, group.world_size, timeout=timeout))
    store.set_timeout(timeout)
    process_group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(group.backend), PrefixStore(group.group_name, store),
        group_name=group.group_name, timeout=timeout,
    )
    _world.pg_group_ranks[process_group] = {i: i for i in range(world_size)}
    return process_group


