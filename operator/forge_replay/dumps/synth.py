"""Synthetic slime-format dumps of any shape, so a memory test needs no rollout run at all."""

from __future__ import annotations

import errno
import random
from collections.abc import Iterable

from forge_replay.api.dump_path import MAX_COMPONENT_BYTES, eval_path, is_template, train_path
from forge_replay.dumps.bounds import quote
from forge_replay.dumps.files import save
from forge_replay.dumps.progress_bars import progress_bar
from forge_replay.dumps.sample import Sample

DEFAULT_VOCAB_SIZE = 1000


def synth_samples(
    rollout_id: int,
    prompts: int,
    samples_per_prompt: int,
    prompt_len: int,
    response_len: int,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    ragged: bool = False,
) -> list[Sample]:
    """``prompts * samples_per_prompt`` samples grouped by ``group_index``, with raw float rewards.

    Each sample is an episode of its own: its ``rollout_id`` is its ``index``, as the frameworks number a rollout
    that leaves it unset. slime splits training steps by episode and fails on a rollout with fewer episodes than a
    step takes; miles wants one reward per episode in a group (the rules steps-split-by-episode and
    rollout-shares-reward of frameworks/upstream_rules.json). The rollout the sample was made for is in
    ``metadata["rollout_id"]``.

    Token ids are drawn from ``[0, vocab_size)`` (keep it small for tiny models). With ``ragged``,
    response lengths vary in ``[1, response_len]``; otherwise every response is ``response_len``.
    Deterministic for a given (seed, rollout_id).
    """
    if min(prompts, samples_per_prompt, prompt_len, response_len, vocab_size) < 1:
        raise ValueError("prompts, samples_per_prompt, prompt_len, response_len and vocab_size must all be >= 1")
    rng = random.Random(f"{seed}:{rollout_id}")
    samples = []
    for group in range(prompts):
        prompt_tokens = [rng.randrange(vocab_size) for _ in range(prompt_len)]
        for k in range(samples_per_prompt):
            length = rng.randint(1, response_len) if ragged else response_len
            response_tokens = [rng.randrange(vocab_size) for _ in range(length)]
            truncated = length == response_len and rng.random() < 0.25
            samples.append(
                Sample(
                    group_index=group,
                    rollout_id=group * samples_per_prompt + k,
                    index=group * samples_per_prompt + k,
                    prompt=f"synthetic prompt {group}",
                    tokens=prompt_tokens + response_tokens,
                    response=f"synthetic response {group}.{k}",
                    response_length=length,
                    reward=float(rng.random() < 0.5),
                    loss_mask=None,
                    rollout_log_probs=[-rng.random() * 4.0 for _ in range(length)],
                    status=Sample.Status.TRUNCATED if truncated else Sample.Status.COMPLETED,
                    metadata={"synthetic": True, "seed": seed, "rollout_id": rollout_id},
                )
            )
    return samples


def write_synth_dumps(
    template: str,
    num_rollouts: int,
    prompts: int,
    samples_per_prompt: int,
    prompt_len: int,
    response_len: int,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    eval_ids: Iterable[int] = (),
    start_rollout_id: int = 0,
    ragged: bool = False,
    progress: bool = False,
) -> list[str]:
    """Write train dumps for rollouts ``start..start+num_rollouts-1`` (and ``eval_N`` files); return paths.

    ``template`` is a filesystem path, literal or with ``{rollout_id}`` (a literal path gets one file).
    """
    eval_ids = list(eval_ids)
    if eval_ids and not is_template(template):
        raise ValueError(f"eval dumps need a {{rollout_id}} template, got the literal path {template!r}")
    rollout_ids = list(range(start_rollout_id, start_rollout_id + num_rollouts)) if is_template(template) else [0]
    jobs: list[tuple[str, int]] = [(train_path(template, r), r) for r in rollout_ids]
    jobs += [(eval_path(template, e) or "", e) for e in eval_ids]
    for path, _ in jobs:  # every path first: nothing is written when one of them cannot be
        check_output_path(path)
    written = []
    with progress_bar(progress, len(jobs), "writing dumps") as advance:
        for path, rollout_id in jobs:
            samples = synth_samples(
                rollout_id, prompts, samples_per_prompt, prompt_len, response_len, seed, vocab_size, ragged
            )
            save(path, rollout_id, samples)
            written.append(path)
            advance(path)
    return written


def check_output_path(path: str) -> None:
    """Raise OSError (as the write would, but naming the path briefly) for a path no file system takes.

    A NUL character or a component over 255 bytes made ``--synth-missing`` and ``dumps synth``
    end in a traceback; callers already report OSError.
    """
    if "\x00" in path:
        raise OSError(errno.EINVAL, "the path contains a NUL character", quote(path))
    for part in path.split("/"):
        if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
            size = len(part.encode("utf-8", "surrogateescape"))
            raise OSError(
                errno.ENAMETOOLONG, f"a path component has {size} bytes, file systems allow {MAX_COMPONENT_BYTES}", quote(path)
            )
