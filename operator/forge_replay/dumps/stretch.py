"""``spec.replay.stretch``: a rollout's recorded samples stretched to a longer context (pure functions, no torch).

A team tests 64k with the dumps of its 32k run, its own data's shape kept. For one rollout, with ``L`` its longest
sample's total tokens (``len(tokens)``, prompt + response) and ``M`` = ``maxTokens``:

- every sample's total becomes ``T * M // L`` (the longest exactly ``M``, every other its share of it, rounded
  down); its prompt is kept, so its response grows to the rest: the response tokens are tiled (repeated from the
  start) to that length, and ``response_length`` says so;
- every per-token field is tiled in step, so each stays aligned with the tokens: a field as long as the response
  (``loss_mask``, ``rollout_log_probs``, ``teacher_log_probs``, ...), as long as ``tokens`` or one shorter (one entry
  per predicted position, as ``rollout_routed_experts``) keeps its prompt part and tiles its response part. Lists,
  tuples, numpy arrays and torch tensors are tiled alike; a field of another length is not per-token and is kept;
- prompts, rewards, groups (``group_index``, ``index``, ``rollout_id``), status and every other field are kept. The
  response text is kept too: the trainer trains the token ids.

``maxTokens`` below the longest sample is refused, naming the field and the sample: stretching never shortens (a
shorter context is a test of other dumps; cutting responses would drop the loss tokens at their end and break the
prompt / response shares the stretch keeps). A sample with an empty response has nothing to tile and is kept.

The samples are not changed: stretched copies are returned with a :class:`StretchRecord` for report.json. The
trainer's :class:`~forge_replay.dumps.convert.Conversion` stretches before it converts, so ``replay.verify`` checks the
stretched samples as training sees them; :func:`position_problem` is the check against the model's positions that
the pre-flight runs before any GPU is requested.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from forge_replay.dumps.sample import Sample, SampleError

STRETCH_FIELD = "spec.replay.stretch.maxTokens"
RESPONSE_FIELDS = ("loss_mask", "rollout_log_probs", "teacher_log_probs")
"""Declared fields with one entry per response token: one of another length is refused, never left misaligned."""
NOT_PER_TOKEN = frozenset({"tokens", "prompt", "response", "response_length", "weight_versions"})
"""Fields never tiled: the tokens (stretched on their own), texts, and per-turn lists that may be as long by chance."""


@dataclass(frozen=True)
class StretchRecord:
    """What one rollout's stretch did, for report.json: the longest sample before and after, the factor
    (``max_tokens / longest_before``) and the rollout's tokens before and after."""

    max_tokens: int
    longest_before: int
    longest_after: int
    factor: float
    tokens_before: int
    tokens_after: int

    def to_dict(self) -> dict:
        return asdict(self)


def position_problem(max_tokens: int, max_positions: int | None) -> str | None:
    """Why ``maxTokens`` cannot be trained by a model of ``max_positions`` positions (max_position_embeddings), or None
    (also when the model's positions are not known). The stretched longest sample is exactly ``max_tokens`` long."""
    if max_positions is not None and max_tokens > max_positions:
        return f"{STRETCH_FIELD}: {too_long(str(max_tokens), max_positions)}"
    return None


def too_long(max_tokens: str, max_positions: int, verb: str = "is") -> str:
    return (f"{max_tokens} {verb} more than the model's {max_positions} positions (max_position_embeddings); the "
            f"stretched longest sample would not fit the model")


def _length(value: Any) -> int | None:
    """The first dimension of a list, tuple, numpy array or torch tensor; None for anything else (scalars too)."""
    if isinstance(value, list | tuple):
        return len(value)
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, str | bytes | dict) and len(tuple(shape)) >= 1:
        return int(tuple(shape)[0])
    return None


def _tiled(value: Any, keep: int, old: int, new: int) -> Any:
    """``value``'s first ``keep`` entries, then its ``old`` entries after them repeated to ``new`` entries."""
    if isinstance(value, list | tuple):
        head, tail = value[:keep], value[keep:keep + old]
        repeats = -(-new // old)
        return head + (tail * repeats)[:new]
    index = [*range(keep), *(keep + j % old for j in range(new))]
    return value[index]  # numpy arrays and torch tensors: advanced indexing keeps the type and dtype


def _sizes(sample: Sample, index: int) -> tuple[int, int]:
    """``(len(tokens), response_length)`` of a sample, each checked (SampleError naming the field)."""
    total = _length(sample.tokens)
    if total is None or total == 0:
        raise SampleError(index, "tokens", f"expected a non-empty list of ints, got {type(sample.tokens).__name__}"
                          + (" of length 0" if total == 0 else ""))
    length = sample.response_length
    if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length < total:
        raise SampleError(index, "response_length", f"{length!r} is not an int in 0..len(tokens)-1={total - 1}")
    return total, length


def _stretched(sample: Sample, index: int, total: int, response: int, new_total: int) -> Sample:
    """A copy of ``sample`` whose response and per-token fields are tiled to ``new_total`` tokens."""
    prompt = total - response
    new_response = new_total - prompt
    out = copy.copy(sample)
    tokens = sample.tokens.tolist() if hasattr(sample.tokens, "tolist") else sample.tokens
    out.tokens = list(_tiled(list(tokens), prompt, response, new_response))
    out.response_length = new_response
    for name, value in sample.__dict__.items():
        if name in NOT_PER_TOKEN or value is None:
            continue
        size = _length(value)
        if name in RESPONSE_FIELDS and size != response:
            raise SampleError(index, name, f"has length {size}, expected response_length={response}"
                              if size is not None else f"expected a list, got {type(value).__name__}")
        if size == response:  # one per response token (with one prompt token, also one per predicted position)
            setattr(out, name, _tiled(value, 0, response, new_response))
        elif size == total:  # one per token
            setattr(out, name, _tiled(value, prompt, response, new_response))
        elif size == total - 1:  # one per predicted position: the prompt's last token predicts the first response one
            setattr(out, name, _tiled(value, prompt - 1, response, new_response))
    return out


def stretch_samples(samples: Sequence[Sample], max_tokens: int) -> tuple[list[Sample], StretchRecord]:
    """One rollout's samples stretched so that the longest is ``max_tokens`` tokens long (see the module doc), and the
    record of it. Raises SampleError: a sample whose sizes cannot be read, or ``max_tokens`` below the longest sample
    (naming ``spec.replay.stretch.maxTokens`` and that sample)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise SampleError(None, STRETCH_FIELD, f"{max_tokens!r} is not a positive int")
    if not samples:
        raise SampleError(None, "samples", "no samples to stretch")
    sizes = [_sizes(sample, i) for i, sample in enumerate(samples)]
    longest = max(total for total, _ in sizes)
    if max_tokens < longest:
        at = next(i for i, (total, _) in enumerate(sizes) if total == longest)
        raise SampleError(at, STRETCH_FIELD, f"{max_tokens} is below this sample's {longest} tokens, the rollout's "
                          f"longest: a stretch only lengthens; set maxTokens to at least {longest} or remove "
                          "spec.replay.stretch")
    stretched = []
    for i, (sample, (total, response)) in enumerate(zip(samples, sizes)):
        new_total = total * max_tokens // longest if response else total
        stretched.append(_stretched(sample, i, total, response, new_total) if new_total > total
                         else copy.copy(sample))
    after = [len(s.tokens) for s in stretched]
    record = StretchRecord(max_tokens=max_tokens, longest_before=longest, longest_after=max(after),
                           factor=max_tokens / longest, tokens_before=sum(t for t, _ in sizes), tokens_after=sum(after))
    return stretched, record
