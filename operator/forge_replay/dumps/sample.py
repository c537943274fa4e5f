"""The slime/miles ``Sample`` as stored in rollout dumps, without importing slime.

A dump holds ``Sample.to_dict()`` of every sample: the object's ``__dict__`` with ``status`` as
its string value and ``spec_info`` / ``prefix_cache_info`` as small dicts. Attributes added at
run time (``trace``), stray fields of older dumps (``group_id``) and miles' own fields (``adapter``,
``reward_spec``, ``rollout_indexer_topk``, ...) are kept as extra attributes, so
``Sample.from_dict(d).to_dict() == d`` for every key of ``d``. Upstream objects in a dump (miles'
``AdapterRef``, PIL images) arrive as the inert equivalents of :mod:`forge_replay.dumps.inert`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from forge_replay.dumps.bounds import quote
from forge_replay.errors import Portable


class SampleError(Portable, ValueError):
    """A sample is inconsistent; the message names the sample index and the field."""

    def __init__(self, index: int | None, field_name: str, problem: str, where: str | None = None):
        self.index = index
        self.field = field_name
        self.problem = problem
        self.where = where
        at = f"sample {index}" if index is not None else "samples"
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{at}, field {field_name!r}: {problem}")


def _spec_info_default() -> dict[str, int]:
    return {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0, "completion_token_num": 0}


def _prefix_cache_info_default() -> dict[str, int]:
    return {"cached_tokens": 0, "total_prompt_tokens": 0}


@dataclass(eq=True)
class Sample:
    """One generated sample, field for field as slime's ``slime.utils.types.Sample``."""

    class Status(str, Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: Any = None
    apply_chat_template_kwargs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None  # int32 CPU tensor or nested list
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: Sample.Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: dict[str, Any] = field(default_factory=_spec_info_default)
    prefix_cache_info: dict[str, Any] = field(default_factory=_prefix_cache_info_default)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The declared slime fields, in slime's order."""
        return _FIELD_NAMES

    def extra_fields(self) -> dict[str, Any]:
        """Attributes that are not declared slime fields (run-time extras, stray old fields)."""
        return {k: v for k, v in self.__dict__.items() if k not in _FIELD_SET}

    def to_dict(self) -> dict[str, Any]:
        """slime's ``Sample.to_dict()``: ``__dict__`` with ``status`` as its string value."""
        value = self.__dict__.copy()
        value["status"] = Sample.Status(self.status).value
        value["spec_info"] = dict(self.spec_info) if self.spec_info is not None else _spec_info_default()
        value["prefix_cache_info"] = (
            dict(self.prefix_cache_info) if self.prefix_cache_info is not None else _prefix_cache_info_default()
        )
        return value

    @classmethod
    def from_dict(cls, data: dict[str, Any], index: int | None = None, where: str | None = None) -> Sample:
        """Build a Sample from a dump dict; unknown keys become extra attributes (kept by ``to_dict``).

        ``index``/``where`` only serve error messages (sample position, file path).
        """
        if not isinstance(data, dict):
            raise SampleError(index, "<sample>", f"expected a dict, got {type(data).__name__}", where)
        known = {k: v for k, v in data.items() if k in _FIELD_SET}
        raw_status = known.get("status", Sample.Status.PENDING.value)
        if not isinstance(raw_status, str | Enum):  # Status(x) hashes x: only strings get that far
            allowed = "|".join(s.value for s in Sample.Status)
            raise SampleError(index, "status", f"{quote(raw_status)} is not one of {allowed}", where)
        try:
            known["status"] = Sample.Status(raw_status.value if isinstance(raw_status, Enum) else raw_status)
        except ValueError:
            allowed = "|".join(s.value for s in Sample.Status)
            raise SampleError(index, "status", f"{quote(raw_status)} is not one of {allowed}", where) from None
        for name, default in (("spec_info", _spec_info_default), ("prefix_cache_info", _prefix_cache_info_default)):
            raw = known.get(name)
            if raw is None:
                known[name] = default()
            elif isinstance(raw, dict):
                known[name] = {**default(), **raw}
            else:
                raise SampleError(index, name, f"expected a dict, got {type(raw).__name__}", where)
        sample = cls(**known)
        for key, value in data.items():
            if key not in _FIELD_SET:
                if not isinstance(key, str) or not key.isidentifier():
                    raise SampleError(index, quote(key), "extra key is not a valid attribute name", where)
                if key.startswith("__") or hasattr(cls, key):  # __class__, __dict__, to_dict, Status, ...
                    name = key if len(key) <= 100 else key[:97] + "..."
                    raise SampleError(index, name, f"extra key would replace Sample.{name}; it is not a data field", where)
                setattr(sample, key, value)
        return sample

    def has_multimodal_inputs(self) -> bool:
        """True when ``multimodal_inputs`` or ``multimodal_train_inputs`` hold anything (images, videos,
        pixel_values, ...): data the builtin trainer does not train on (it trains the tokens)."""
        for value in (self.multimodal_inputs, self.multimodal_train_inputs):
            if isinstance(value, dict):
                if any(item is not None and _nonempty(item) for item in value.values()):
                    return True
            elif value is not None and _nonempty(value):
                return True
        return False

    def reward_value(self, reward_key: str | None) -> float | None:
        """The scalar reward: a dict reward is looked up by ``reward_key``; None stays None."""
        if self.reward is None:
            return None
        if isinstance(self.reward, dict):
            if reward_key is None:
                raise KeyError(f"reward is a dict (keys {sorted(self.reward)}) and no reward key is set")
            return float(self.reward[reward_key])
        return float(self.reward)


def _nonempty(value: Any) -> bool:
    if hasattr(value, "numel"):
        return bool(value.numel())
    try:
        return len(value) > 0
    except TypeError:
        return True


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Sample))
_FIELD_SET = frozenset(_FIELD_NAMES)
