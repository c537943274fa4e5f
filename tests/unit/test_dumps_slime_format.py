"""A stand-alone mimic of slime's Sample and dump writer, and tests that our reader matches it.

``SlimeSample`` reproduces ``slime.utils.types.Sample`` (THUDM/slime slime/utils/types.py @ 624b824a:
plain Enum status, SpecInfo / PrefixCacheInfo dataclasses, the top-p replay fields
``rollout_top_p_token_ids`` / ``rollout_top_p_token_offsets``, ``to_dict`` = ``__dict__`` with converted members) and
``save_debug_rollout_data`` reproduces slime's ``torch.save`` call, so dumps written here are
byte-for-byte what slime writes. Other dump tests import these helpers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from forge_replay.dumps import Sample, load, save


@dataclass
class SlimeSample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
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
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def to_dict(self):
            return dict(self.__dict__)

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def to_dict(self):
            return dict(self.__dict__)

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self):
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value


def save_debug_rollout_data(path, rollout_id: int, samples: list[SlimeSample]) -> None:
    """slime's writer: ``torch.save({"rollout_id": ..., "samples": [s.to_dict() ...]}, path)``."""
    torch.save({"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}, path)


def slime_samples(
    n_groups: int = 3,
    group_size: int = 4,
    seed: int = 0,
    dict_rewards: bool = False,
    max_response: int = 40,
    rollout_id: int | None = None,
) -> list[SlimeSample]:
    """Realistic slime samples: ragged responses, loss_mask None or explicit, int32 routed experts,
    run-time extras (``trace``), a stray old field (``group_id``), chat prompts, aborted/truncated."""
    rng = random.Random(seed)
    samples = []
    statuses = [SlimeSample.Status.COMPLETED, SlimeSample.Status.TRUNCATED, SlimeSample.Status.ABORTED]
    for g in range(n_groups):
        prompt_tokens = [rng.randrange(50_000) for _ in range(rng.randint(3, 12))]
        for k in range(group_size):
            length = rng.randint(1, max_response)
            reward: Any = float(rng.random())
            if dict_rewards:
                reward = {"accuracy": float(rng.random() < 0.5), "format": rng.random()}
            if (g + k) % 5 == 4:
                reward = None if not dict_rewards else reward
            sample = SlimeSample(
                group_index=g,
                index=g * group_size + k,
                rollout_id=rollout_id,
                prompt=[{"role": "user", "content": f"question {g}"}] if g % 2 else f"question {g}",
                tokens=prompt_tokens + [rng.randrange(50_000) for _ in range(length)],
                response=f"answer {g}.{k}",
                response_length=length,
                label=str(g),
                reward=reward,
                loss_mask=None if k % 2 == 0 else [rng.randint(0, 1) for _ in range(length)],
                weight_versions=["3"],
                rollout_log_probs=[-rng.random() for _ in range(length)],
                rollout_routed_experts=torch.randint(0, 64, (len(prompt_tokens) + length, 2), dtype=torch.int32)
                if k == 1
                else None,
                remove_sample=(g == 1 and k == 3),
                status=statuses[(g + k) % len(statuses)],
                metadata={"source": "gsm8k", "turn": k},
            )
            sample.spec_info.spec_accept_token_num = k
            sample.prefix_cache_info.cached_tokens = g
            sample.trace = {"spans": [{"name": "generate", "ms": 1.5 * k}]}  # run-time extra attribute
            if g == 0:
                sample.group_id = g  # stray field of older dumps
            samples.append(sample)
    return samples


def assert_same(a: Any, b: Any) -> None:
    """Deep equality that compares tensors by dtype, shape and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), (a, b)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (sorted(a), sorted(b))
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def test_slime_dump_loads_field_for_field(tmp_path):
    slime = slime_samples(rollout_id=None)
    path = tmp_path / "rollout_5.pt"
    save_debug_rollout_data(path, 5, slime)
    dump = load(path)
    assert dump.rollout_id == 5 and dump.path == str(path)
    assert len(dump.samples) == len(slime)
    for ours, theirs in zip(dump.samples, slime):
        assert_same(ours.to_dict(), theirs.to_dict())
    first = dump.samples[0]
    assert first.trace == {"spans": [{"name": "generate", "ms": 0.0}]}
    assert first.group_id == 0 and set(first.extra_fields()) == {"trace", "group_id"}
    assert dump.samples[1].rollout_routed_experts.dtype == torch.int32
    assert dump.samples[1].status is Sample.Status.TRUNCATED and dump.samples[1].status == "truncated"
    assert dump.samples[0].loss_mask is None and isinstance(dump.samples[1].loss_mask, list)
    assert dump.samples[4].prompt == [{"role": "user", "content": "question 1"}]


def test_our_save_is_slimes_format(tmp_path):
    slime = slime_samples(dict_rewards=True)
    ours = [Sample.from_dict(s.to_dict()) for s in slime]
    path = tmp_path / "ours.pt"
    save(path, 2, ours)
    blob = torch.load(path, weights_only=False)  # our own file: the reference reader may run here
    assert list(blob) == ["rollout_id", "samples"] and blob["rollout_id"] == 2
    for written, theirs in zip(blob["samples"], slime):
        assert_same(written, theirs.to_dict())
        assert list(written) == list(theirs.to_dict())  # same key order as slime's __dict__


def test_sample_status_and_defaults_match_slime():
    assert [s.value for s in Sample.Status] == [s.value for s in SlimeSample.Status]
    assert_same(Sample().to_dict(), SlimeSample().to_dict())
    assert list(Sample().to_dict()) == list(SlimeSample().to_dict())
