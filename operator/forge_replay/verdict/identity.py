"""What makes two runs comparable: the job's identity (report.json ``identity``) and its ``environment``.

Pure functions: :func:`identity_of` takes a job spec; the differences take two parsed reports. A different
mode or model makes a comparison meaningless (it fails unless allowed); anything else is a warning that the
numbers may differ for that reason alone.
"""

from __future__ import annotations

import hashlib
import json

ENVIRONMENT_KEYS = ("seed", "torch", "transformers", "forge_replay", "device", "world_size", "deterministic",
                    "threads", "cuda", "sglang")
"""What report.json's ``environment`` records for a baseline comparison to be meaningful. ``threads``: on CPU a
debug replay is bit for bit only at equal thread counts (torch's intra-op threads, OMP_NUM_THREADS,
MKL_NUM_THREADS). ``device`` is the GPU product. With the job's spec the environment also holds what explains a run
whose memory or speed moved (the runtime's ``run_settings``: the memory-only ``trainer`` settings,
``images``, ``engine_args``, ``engines``) and in a cluster the Ray pods' ``image_digests``
(``forge_replay.api.images``), which :mod:`.explain` compares generically (issue 35)."""

BLOCKING = ("mode", "model")
"""Identity fields whose difference fails a comparison unless it is allowed (``--allow-different``,
``spec.expect.baseline.allowDifferent``)."""


def model_identity(model) -> dict:
    """The model of ``spec.model`` as a comparison sees it: the SHA-256 of its config (canonical JSON) for a
    random init, or its claim and path for a checkpoint."""
    if model.config is not None:
        canonical = json.dumps(model.config, sort_keys=True, separators=(",", ":"))
        return {"config_sha256": hashlib.sha256(canonical.encode("utf-8")).hexdigest()}
    return {"claim_name": model.claim_name, "path": model.path}


def identity_of(name: str, spec) -> dict:
    """report.json's ``identity``: job name, mode, dump path template, the stretch (spec.replay.stretch.maxTokens),
    model and the settings that change the numbers a baseline compares (learning rate, clipping, dtype,
    micro-batching, advantages, seed, reward key)."""
    t = spec.trainer
    return {
        "job": name,
        "mode": spec.replay.mode,
        "dumps_path": spec.replay.dumps.path,
        "stretch_max_tokens": None if spec.replay.stretch is None else spec.replay.stretch.max_tokens,
        "model": model_identity(spec.model),
        "trainer": {
            "backend": t.backend,
            "learning_rate": t.learning_rate,
            "clip_eps": t.clip_eps,
            "clip_eps_high": t.clip_eps_high if t.clip_eps_high is not None else t.clip_eps,
            "dtype": t.dtype,
            "micro_batch_tokens": t.micro_batch_tokens,
            "gradient_checkpointing": t.gradient_checkpointing,
            "n_samples_per_prompt": t.n_samples_per_prompt,
            "normalize_advantage_std": t.normalize_advantage_std,
            "seed": t.seed,
            "reward_key": spec.replay.reward_key,
        },
    }


def identity_differences(report: dict, baseline: dict) -> tuple[list[str], list[str]]:
    """``(blocking, warnings)``: one line per identity field the two reports recorded differently. ``blocking``
    holds the BLOCKING fields (mode, model); a report without an identity (an older version) is a warning."""
    mine, theirs = report.get("identity"), baseline.get("identity")
    if not mine or not theirs:
        missing = "the run" if not mine else "the baseline"
        return [], [f"{missing} recorded no identity (job, mode, dumps, model, trainer settings): cannot tell "
                    "whether the two runs replayed the same job"]
    blocking, warnings = [], []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        if key == "trainer" and isinstance(a, dict) and isinstance(b, dict):
            warnings += [f"trainer.{k}: {a.get(k)!r} here, {b.get(k)!r} in the baseline"
                         for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            (blocking if key in BLOCKING else warnings).append(f"{key}: {a!r} here, {b!r} in the baseline")
    return blocking, warnings


def another_job(report: dict, baseline: dict, allow_different: bool) -> str | None:
    """Why ``baseline`` cannot be compared with ``report``: the BLOCKING fields they recorded differently, and how to
    compare anyway (the text after "is of another job: "); None when none differs or ``allow_different``."""
    blocking, _ = identity_differences(report, baseline)
    if not blocking or allow_different:
        return None
    return f"{'; '.join(blocking)} (spec.expect.baseline.allowDifferent: true compares anyway)"


def environment_differences(report: dict, baseline: dict) -> list[str]:
    """What the two reports recorded differently among ENVIRONMENT_KEYS (a comparison across them may differ
    for that reason alone); one line each."""
    mine, theirs = report.get("environment") or {}, baseline.get("environment") or {}
    if not mine or not theirs:
        missing = "the run" if not mine else "the baseline"
        return [f"{missing} recorded no environment (seed, versions, device, world size, threads): cannot tell "
                "whether the two runs are comparable"]
    return [f"{key}: {mine.get(key)!r} here, {theirs.get(key)!r} in the baseline"
            for key in ENVIRONMENT_KEYS if mine.get(key) != theirs.get(key)]
