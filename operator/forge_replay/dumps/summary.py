"""What a dump holds: sample/group counts, token-length, reward and status statistics (pure)."""

from __future__ import annotations

import math
import numbers
import os
from collections import Counter
from typing import Any

from forge_replay.dumps.convert import check_samples
from forge_replay.dumps.files import Dump
from forge_replay.dumps.sample import Sample, SampleError

# Optional fields reported as present when at least one sample has a non-empty value.
OPTIONAL_FIELDS = (
    "loss_mask",
    "rollout_log_probs",
    "teacher_log_probs",
    "rollout_routed_experts",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "label",
    "train_metadata",
    "weight_versions",
)


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered)
    variance = sum((v - mean) * (v - mean) for v in ordered) / len(ordered)  # ** overflows with an error
    return {
        "min": ordered[0],
        "mean": mean,
        "p50": ordered[len(ordered) // 2],
        "max": ordered[-1],
        "std": math.sqrt(variance),
    }


def _present(value: Any) -> bool:
    if value is None:
        return False
    if hasattr(value, "numel"):
        return True
    try:
        return len(value) > 0
    except TypeError:
        return True


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number that fits one (not a bool, not 10**400), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, ValueError):
        return None


def _length(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None


def summarize(dump: Dump) -> dict[str, Any]:
    """A JSON-ready summary of ``dump`` (what `forge-replay dumps inspect` prints).

    Whatever the samples hold, this does not fail: values of the wrong type are left out of the
    statistics, and ``problem`` holds the first error training would raise (from the same checks).
    """
    samples = dump.samples
    lengths = [(_length(s.tokens), s.response_length) for s in samples]
    good = [(n, r) for n, r in lengths if n is not None and type(r) is int]
    scalar_rewards: list[float] = []
    dict_rewards: dict[str, list[float]] = {}
    none_rewards = 0
    for s in samples:
        if s.reward is None:
            none_rewards += 1
        elif isinstance(s.reward, dict):
            for key, value in s.reward.items():
                if _number(value) is not None:
                    dict_rewards.setdefault(str(key)[:100], []).append(_number(value))
        elif _number(s.reward) is not None:
            scalar_rewards.append(_number(s.reward))
    group_keys = [s.group_index if type(s.group_index) is int or s.group_index is None else "invalid" for s in samples]
    groups = Counter(g for g in group_keys if g != "invalid")
    rollout_ids = {s.rollout_id for s in samples if type(s.rollout_id) is int or s.rollout_id is None}
    extras = sorted({name for s in samples for name in s.extra_fields()})
    try:
        masked_out, problem = check_samples(samples), None
    except SampleError as exc:
        masked_out, problem = None, str(exc)
    return {
        "path": dump.path,
        "format": "packed" if _is_packed(dump.path) else "torch",
        "file_bytes": os.path.getsize(dump.path) if os.path.exists(dump.path) else None,
        "rollout_id": dump.rollout_id,
        "samples": len(samples),
        "groups": len([g for g in groups if g is not None]),
        "samples_without_group_index": groups.get(None, 0),
        "group_sizes": dict(sorted(Counter(n for g, n in groups.items() if g is not None).items())),
        "sample_rollout_ids": sorted(rollout_ids, key=lambda r: (r is None, r or 0)),
        "total_tokens": sum(n for n, _ in good),
        "prompt_tokens": _stats([float(n - r) for n, r in good]),
        "response_tokens": _stats([float(r) for _, r in good]),
        "reward": {
            "scalar": _stats(scalar_rewards),
            "by_key": {key: _stats(values) for key, values in sorted(dict_rewards.items())},
            "none": none_rewards,
        },
        "status": dict(sorted(Counter(Sample.Status(s.status).value for s in samples).items())),
        "removed_samples": sum(1 for s in samples if s.remove_sample is True),
        "masked_out_samples": masked_out,
        "optional_fields": {
            name: sum(1 for s in samples if _present(getattr(s, name))) for name in OPTIONAL_FIELDS
        },
        "extra_fields": extras,
        "multimodal_samples": sum(1 for s in samples if s.has_multimodal_inputs()),
        "problem": problem,
    }


def _is_packed(path: str) -> bool:
    from forge_replay.dumps.packed import is_packed

    return is_packed(path)


def render_text(summary: dict[str, Any]) -> str:
    """Human-readable lines for a summary."""

    def fmt(stats: dict[str, float] | None) -> str:
        if stats is None:
            return "-"
        return "min {min:g}  mean {mean:.4g}  p50 {p50:g}  max {max:g}  std {std:.4g}".format(**stats)

    lines = [
        f"{summary['path']}  ({summary['format']}, {summary['file_bytes']} bytes)",
        f"rollout_id {summary['rollout_id']}: {summary['samples']} samples in {summary['groups']} groups"
        f" (group sizes {summary['group_sizes']}, {summary['samples_without_group_index']} without group_index)",
        f"sample rollout_ids: {_compact(summary['sample_rollout_ids'])}",
        f"total tokens {summary['total_tokens']}",
        f"prompt tokens    {fmt(summary['prompt_tokens'])}",
        f"response tokens  {fmt(summary['response_tokens'])}",
        f"reward           {fmt(summary['reward']['scalar'])}  (None: {summary['reward']['none']})",
    ]
    for key, stats in summary["reward"]["by_key"].items():
        lines.append(f"reward[{key!r}]  {fmt(stats)}")
    lines.append(f"status           {summary['status']}  removed: {summary['removed_samples']}")
    present = {k: v for k, v in summary["optional_fields"].items() if v}
    lines.append(f"optional fields  {present or 'none'}")
    lines.append(f"extra fields     {summary['extra_fields'] or 'none'}")
    if summary["masked_out_samples"]:
        lines.append(f"all-zero loss masks: {summary['masked_out_samples']} sample(s)")
    if summary["multimodal_samples"]:
        lines.append(f"multimodal inputs: {summary['multimodal_samples']} sample(s) (the builtin trainer trains their"
                     " text tokens only)")
    lines.append(f"training would refuse it: {summary['problem']}" if summary["problem"] else "training checks: ok")
    return "\n".join(lines)


def _compact(values: list, shown: int = 8) -> str:
    """A list as is when short; else its count and its ends (a dump's samples carry one rollout_id per episode)."""
    if len(values) <= shown:
        return str(values)
    return f"{len(values)} distinct, {values[0]} ... {values[-1]}"
