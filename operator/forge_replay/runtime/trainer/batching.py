"""Splitting a rollout across trainer ranks and packing it into micro-batches (pure functions).

Every rank must run the same number of micro-batches, because FSDP's collectives run once per
forward/backward: ranks with fewer get empty micro-batches (two dummy tokens, zero loss mask).
Samples are packed into one sequence per micro-batch with position ids restarting at 0 for each
sample; the model's attention then never crosses samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class BatchError(ValueError):
    """A sample cannot be trained on; the message names the sample index and the field."""


def assign_to_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Sample indices per rank, balanced by token count (longest first onto the lightest rank).

    Each rank's indices are kept in ascending order so the run is deterministic.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [0] * world_size
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        ranks[rank].append(index)
        loads[rank] += lengths[index]
    return [sorted(r) for r in ranks]


def pack_micro_batches(indices: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Pack samples into micro-batches of at most ``max_tokens`` tokens (first fit, longest first).

    A sample longer than ``max_tokens`` gets a micro-batch of its own (it cannot be split).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(indices, key=lambda i: (-lengths[i], i)):
        size = lengths[index]
        for b, free in enumerate(room):
            if size <= free:
                bins[b].append(index)
                room[b] -= size
                break
        else:
            bins.append([index])
            room.append(max_tokens - size)
    return [sorted(b) for b in bins]


def plan_step(lengths: Sequence[int], world_size: int, max_tokens: int) -> list[list[list[int]]]:
    """Per rank, the list of micro-batches (sample indices); every rank gets the same count.

    An empty list stands for a dummy micro-batch that only keeps the collectives in step.
    """
    per_rank = [pack_micro_batches(idx, lengths, max_tokens) for idx in assign_to_ranks(lengths, world_size)]
    count = max(1, max(len(mbs) for mbs in per_rank))
    return [mbs + [[] for _ in range(count - len(mbs))] for mbs in per_rank]


@dataclass
class MicroBatch:
    """One packed sequence. Per-token arrays are aligned with ``input_ids``: entry j describes
    the prediction of token j from the tokens before it (entry 0 of every sample is never trained)."""

    input_ids: np.ndarray  # int64 [T]
    position_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # float32 [T]
    advantages: np.ndarray  # float32 [T]
    old_logp: np.ndarray  # float32 [T]
    has_old_logp: np.ndarray  # float32 [T]
    sample_indices: list[int]

    @property
    def num_tokens(self) -> int:
        return 0 if not self.sample_indices else int(self.input_ids.shape[0])


def segment_bounds(position_ids: Sequence[int]) -> list[int]:
    """Start of every packed sample (where its positions restart at 0) and the end: ``[0, s1, ..., T]``."""
    positions = np.asarray(position_ids)
    if positions.size == 0:
        return [0]
    starts = np.flatnonzero(positions == 0).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [*starts, int(positions.size)]


def dummy_micro_batch() -> MicroBatch:
    """Two tokens with a zero loss mask: runs the collectives, changes no gradient."""
    zeros = np.zeros(2, dtype=np.float32)
    return MicroBatch(
        np.zeros(2, dtype=np.int64), np.arange(2, dtype=np.int64), zeros, zeros, zeros, zeros, []
    )


def build_micro_batch(train_data, indices: Sequence[int], vocab_size: int | None = None) -> MicroBatch:
    """Pack the samples ``indices`` of a ``TrainData`` into one :class:`MicroBatch`.

    With ``vocab_size``, a token id outside the model's vocabulary is an error naming the sample
    (instead of an index error deep inside the embedding).
    """
    if not indices:
        return dummy_micro_batch()
    ids, pos, mask, adv, old, has_old = [], [], [], [], [], []
    log_probs = train_data.rollout_log_probs
    for i in indices:
        tokens = train_data.tokens[i]
        n, r = len(tokens), int(train_data.response_lengths[i])
        if r > n:
            raise BatchError(f"sample {i}: response_length {r} exceeds len(tokens) {n}")
        if r == n and r > 0:
            raise BatchError(
                f"sample {i}: tokens has no prompt token before the response (response_length {r} == "
                f"len(tokens)); the first response token cannot be scored"
            )
        if len(train_data.loss_masks[i]) != r:
            raise BatchError(f"sample {i}: loss_mask has {len(train_data.loss_masks[i])} entries, expected response_length {r}")
        sample_mask = np.zeros(n, dtype=np.float32)
        sample_mask[n - r :] = np.asarray(train_data.loss_masks[i], dtype=np.float32)
        sample_old = np.zeros(n, dtype=np.float32)
        sample_has_old = np.zeros(n, dtype=np.float32)
        sample_lp = None if log_probs is None else log_probs[i]
        if sample_lp is not None:
            if len(sample_lp) != r:
                raise BatchError(f"sample {i}: rollout_log_probs has {len(sample_lp)} entries, expected response_length {r}")
            sample_old[n - r :] = np.asarray(sample_lp, dtype=np.float32)
            sample_has_old[n - r :] = 1.0
        sample_ids = np.asarray(tokens, dtype=np.int64)
        if vocab_size is not None and n and (sample_ids.max() >= vocab_size or sample_ids.min() < 0):
            bad = int(sample_ids.max() if sample_ids.max() >= vocab_size else sample_ids.min())
            raise BatchError(
                f"sample {i}: tokens holds id {bad}, outside the model's vocabulary [0, {vocab_size}) "
                f"(spec.model vocab_size); the dumps were made with another tokenizer or the model config is too small"
            )
        ids.append(sample_ids)
        pos.append(np.arange(n, dtype=np.int64))
        mask.append(sample_mask)
        adv.append(np.full(n, float(train_data.advantages[i]), dtype=np.float32))
        old.append(sample_old)
        has_old.append(sample_has_old)
    return MicroBatch(
        np.concatenate(ids), np.concatenate(pos), np.concatenate(mask), np.concatenate(adv),
        np.concatenate(old), np.concatenate(has_old), list(indices),
    )
