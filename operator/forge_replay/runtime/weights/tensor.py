"""Which trainer rank feeds which colocated engine TP rank on the tensor path (pure).

Engine TP rank ``j`` must open CUDA IPC handles made by the trainer rank on the same physical GPU:
:func:`engine_feeders` works that out from where Ray put the ranks; the wire format is :mod:`.ipc`'s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from forge_replay.runtime.weights.ipc import TensorSyncError


@dataclass(frozen=True)
class EngineGPUs:
    """Where a colocated engine runs: TP rank ``j`` uses GPU ``base_gpu_id + j`` of node ``node_ip``."""

    url: str
    node_ip: str
    base_gpu_id: int
    tp_size: int


@dataclass(frozen=True)
class RankGPU:
    """Where a trainer rank runs: its node and its physical GPU id as Ray reports it (``ray.get_gpu_ids()``)."""

    rank: int
    node_ip: str
    gpu_id: int | str


def _gpu_number(gpu_id: int | str, rank: int) -> int:
    try:
        return int(gpu_id)
    except (TypeError, ValueError):
        raise TensorSyncError(
            f"trainer rank {rank} reports GPU {gpu_id!r}, not a GPU number: colocated engines are placed by "
            f"GPU number (--base-gpu-id), so Ray must report numbers (CUDA_VISIBLE_DEVICES holding UUIDs "
            f"cannot be matched)"
        ) from None


def engine_feeders(engines: Sequence[EngineGPUs], ranks: Sequence[RankGPU]) -> list[tuple[int, ...]]:
    """For each engine (in order), the trainer ranks whose GPUs its TP ranks 0..tp_size-1 use.

    Raises :class:`TensorSyncError` naming the engine and the GPU when no trainer rank sits on one of
    its GPUs, or when two ranks claim the same GPU."""
    by_gpu: dict[tuple[str, int], int] = {}
    on_node: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in ranks:
        key = (r.node_ip, _gpu_number(r.gpu_id, r.rank))
        if key in by_gpu:
            raise TensorSyncError(f"trainer ranks {by_gpu[key]} and {r.rank} both report GPU {key[1]} of node "
                                  f"{key[0]}: each rank must hold its own GPU")
        by_gpu[key] = r.rank
        on_node[r.node_ip].append((key[1], r.rank))
    feeders: list[tuple[int, ...]] = []
    for index, engine in enumerate(engines):
        if engine.tp_size < 1 or engine.base_gpu_id < 0:
            raise TensorSyncError(f"engine {index} ({engine.url}): tp size {engine.tp_size} and base GPU "
                                  f"{engine.base_gpu_id} do not describe any GPU")
        chain = []
        for tp_rank in range(engine.tp_size):
            gpu = engine.base_gpu_id + tp_rank
            rank = by_gpu.get((engine.node_ip, gpu))
            if rank is None:
                held = ", ".join(f"GPU {g}: rank {r}" for g, r in sorted(on_node.get(engine.node_ip, []))) or "none"
                raise TensorSyncError(
                    f"engine {index} ({engine.url}) TP rank {tp_rank} runs on GPU {gpu} of node {engine.node_ip}, "
                    f"but no trainer rank holds that GPU (trainer ranks there: {held}). Colocated engines read "
                    f"the weights from the trainer rank on the same GPU: rollout.numGpus/numGpusPerEngine must "
                    f"lay the engines over the trainer's GPUs"
                )
            chain.append(rank)
        feeders.append(tuple(chain))
    return feeders


@dataclass(frozen=True)
class EngineFeed:
    """One engine of a tensor push: its address and the trainer rank feeding each of its TP ranks, in order.

    ``ranks[0]`` gathers the engine's entries and posts them: it shares the engine's node (it holds one of
    the engine's GPUs), so it reaches the engine even on loopback."""

    url: str
    ranks: tuple[int, ...]


def plan_feeds(engines: Sequence[EngineGPUs], ranks: Sequence[RankGPU]) -> list[EngineFeed]:
    """:func:`engine_feeders` with each engine's address attached."""
    return [EngineFeed(e.url, chain) for e, chain in zip(engines, engine_feeders(engines, ranks), strict=True)]


def tp_roles(feeds: Sequence[EngineFeed], rank: int) -> list[tuple[int, int]]:
    """(engine index, TP rank) for every engine TP rank that trainer rank ``rank`` feeds, engines in order
    (every rank walks its engines in the same order, so their gathers cannot wait on each other in a cycle)."""
    return [(index, tp) for index, feed in enumerate(feeds) for tp, fed_by in enumerate(feed.ranks) if fed_by == rank]


def in_tp_order(gathered: Sequence[tuple[int, str | None] | None], feed: EngineFeed) -> list[str]:
    """The ``(tp_rank, serialized)`` pairs gathered from an engine's trainer ranks as the engine's list,
    entry ``j`` for TP rank ``j``. A missing or empty entry (a rank that failed to serialize) is an error."""
    by_tp: dict[int, str] = {}
    for item in gathered:
        if item is None:
            continue
        tp, serialized = item
        if serialized:
            by_tp[tp] = serialized
    missing = [tp for tp in range(len(feed.ranks)) if tp not in by_tp]
    if missing:
        raise TensorSyncError(f"engine {feed.url}: no tensors for TP rank(s) {missing} (trainer rank(s) "
                              f"{[feed.ranks[tp] for tp in missing]} sent none)")
    return [by_tp[tp] for tp in range(len(feed.ranks))]
