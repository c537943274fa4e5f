"""Stand-ins for the upstream classes miles and slime pickle into rollout dumps, under their real module paths.

miles and slime cannot be installed here; to write dumps exactly as they do, :func:`upstream_modules` registers,
only while its ``with`` block runs, modules named as upstream's with local classes that pickle as the real ones:

- ``miles.utils.types``: the frozen dataclasses ``AdapterRef`` (name, slot) and ``RewardSpec`` (rm_type,
  custom_rm_path), as in radixark/miles miles/utils/types.py @ 31f1ca961a94cb860cec3b2dea34ec332bfa8f76.
  Protocol 2 pickles them as ``GLOBAL miles.utils.types AdapterRef``, ``NEWOBJ``, ``BUILD __dict__``.
- ``PIL.Image``: ``Image``, pickled as Pillow pickles an image: ``Image.__getstate__`` is
  ``[info, mode, size, palette, tobytes()]`` (python-pillow/Pillow src/PIL/Image.py, 13.0), restored by
  ``__setstate__``; ``PIL.PngImagePlugin.PngImageFile`` (what ``Image.open`` returns) adds the filename
  (``ImageFile.__getstate__``). Tests with the real Pillow check the streams are the same.

Every method that upstream would run when loading (``__init__``, ``__setstate__``, ``__post_init__``) records
the call in :data:`CALLS`: a safe load must leave it empty.

:func:`miles_dump` and :func:`vlm_dump` write dumps as miles' ``save_debug_rollout_data``
(miles/ray/rollout/debug_data.py @ 31f1ca96: ``torch.save(dict(rollout_id=..., metadata=metadata or {},
samples=[s.to_dict() ...]))``) and slime's (``{"rollout_id", "samples"}``) write them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

CALLS: list[str] = []


@dataclasses.dataclass(frozen=True)
class AdapterRef:
    name: str
    slot: int

    def __post_init__(self) -> None:
        CALLS.append("AdapterRef.__post_init__")


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    rm_type: str | None = None
    custom_rm_path: str | None = None

    def __setstate__(self, state: Any) -> None:  # not in miles: a loader that ran it would be caught
        CALLS.append("RewardSpec.__setstate__")
        self.__dict__.update(state)


class Image:
    """``PIL.Image.Image`` as far as pickling goes: state ``[info, mode, size, palette, data]``."""

    def __init__(self, mode: str, size: tuple[int, int], data: bytes, info: dict | None = None, palette=None):
        self.mode, self.size, self.data, self.info, self.palette = mode, size, data, dict(info or {}), palette

    def __getstate__(self) -> list[Any]:
        return [self.info, self.mode, self.size, self.palette, self.data]

    def __setstate__(self, state: list[Any]) -> None:
        CALLS.append("Image.__setstate__")
        self.info, self.mode, self.size, self.palette, self.data = state[:5]


class PngImageFile(Image):
    """``PIL.PngImagePlugin.PngImageFile``: ImageFile's state adds the filename."""

    def __init__(self, *args: Any, filename: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.filename = filename

    def __getstate__(self) -> list[Any]:
        return [*super().__getstate__(), self.filename]


_CLASSES = {
    "miles.utils.types": {"AdapterRef": AdapterRef, "RewardSpec": RewardSpec},
    "PIL.Image": {"Image": Image},
    "PIL.PngImagePlugin": {"PngImageFile": PngImageFile},
}


@contextlib.contextmanager
def upstream_modules() -> Iterator[None]:
    """Register ``miles.utils.types``, ``PIL.Image`` and ``PIL.PngImagePlugin`` (and their parents) with the
    stand-ins for the duration of the block; whatever was in ``sys.modules`` before (the real Pillow) is put back."""
    saved = {name: sys.modules.get(name) for name in ("miles", "miles.utils", "miles.utils.types", "PIL", *_CLASSES)}
    originals = {}
    try:
        for full, classes in _CLASSES.items():
            parts = full.split(".")
            for depth in range(1, len(parts)):
                parent = ".".join(parts[:depth])
                if not isinstance(sys.modules.get(parent), _Fake):
                    sys.modules[parent] = _Fake(parent)
            module = _Fake(full)
            for name, cls in classes.items():
                originals[cls] = (cls.__module__, cls.__qualname__)
                cls.__module__, cls.__qualname__ = full, name
                setattr(module, name, cls)
            sys.modules[full] = module
        yield
    finally:
        for cls, (module_name, qualname) in originals.items():
            cls.__module__, cls.__qualname__ = module_name, qualname
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class _Fake(types.ModuleType):
    pass


def rgb_image(width: int, height: int, seed: int = 0, png: bool = False) -> Image:
    """An RGB image with random pixels (an ``Image.open`` result when ``png``)."""
    data = random.Random(seed).randbytes(width * height * 3)
    if png:
        return PngImageFile("RGB", (width, height), data, info={"dpi": (72.0, 72.0)}, filename="")
    return Image("RGB", (width, height), data)


def miles_sample_dicts(n: int, seed: int = 0, tokens: int = 48, layers: int = 4, topk: int = 2) -> list[dict]:
    """miles ``Sample.to_dict()`` of ``n`` samples: adapter / reward_spec by class, int32 numpy MoE replay
    arrays of shape (len(tokens) - 1, layers, topk), metadata with a set and a tuple."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        response = tokens // 2
        ids = rng.integers(0, 151_936, tokens).tolist()
        out.append({
            "group_index": i // 4, "index": i, "rollout_id": None, "prompt": f"question {i // 4}",
            "tokens": ids, "multimodal_inputs": None, "multimodal_train_inputs": None,
            "response": f"answer {i}", "response_length": response, "label": "7", "reward": float(i % 2),
            "loss_mask": [1] * response, "weight_versions": ["3"],
            "rollout_log_probs": (-rng.random(response)).tolist(),
            "rollout_routed_experts": rng.integers(0, 64, (tokens - 1, layers, topk), dtype=np.int32),
            "rollout_indexer_topk": rng.integers(0, tokens, (tokens - 1, 1, topk), dtype=np.int32),
            "remove_sample": False, "teacher_log_probs": None, "opd_reverse_kl": None, "status": "completed",
            "metadata": {"tools": {"search", "python"}, "span": (0, response), "turn": i},
            "generate_function_path": None, "train_metadata": None,
            "adapter": AdapterRef(name=f"lora-{i % 2}", slot=i % 2),
            "reward_spec": RewardSpec(rm_type="math") if i % 2 else None,
            "routing_key": None, "non_generation_time": 0.0,
            "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                          "completion_token_num": 0},
            "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
        })
    return out


def miles_dump(path: Any, rollout_id: int, samples: list[dict], metadata: dict | None = None) -> None:
    """miles' ``save_debug_rollout_data``: rollout_id, metadata (``metadata or {}``), samples."""
    torch.save(dict(rollout_id=rollout_id, metadata=metadata or {}, samples=samples), path)


def vlm_sample_dicts(n: int, seed: int = 0, side: int = 28, tokens: int = 64) -> list[dict]:
    """slime VLM ``Sample.to_dict()``: images in ``multimodal_inputs["images"]`` and in the chat prompt,
    ``pixel_values`` (bf16) and ``image_grid_thw`` (int64) in ``multimodal_train_inputs``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        image = rgb_image(side, side, seed=seed * 1000 + i, png=i % 2 == 1)
        patches = (side // 14) ** 2
        response = tokens // 4
        out.append({
            "group_index": i // 2, "index": i, "rollout_id": None,
            "prompt": [{"role": "user", "content": [{"type": "image", "image": image},
                                                    {"type": "text", "text": "what is this?"}]}],
            "tokens": [rng.randrange(151_936) for _ in range(tokens)],
            "multimodal_inputs": {"images": [image], "videos": None},
            "multimodal_train_inputs": {
                "pixel_values": torch.randn(patches, 1176).to(torch.bfloat16),
                "image_grid_thw": torch.tensor([[1, side // 14, side // 14]], dtype=torch.int64),
            },
            "multimodal_train_input_id": None, "apply_chat_template_kwargs": {},
            "response": "a cat", "response_length": response, "label": None, "reward": 1.0,
            "loss_mask": [1] * response, "weight_versions": [], "rollout_log_probs": None,
            "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None, "rollout_routed_experts": None,
            "remove_sample": False, "teacher_log_probs": None, "status": "completed", "metadata": {},
            "generate_function_path": None, "custom_rm_path": None, "train_metadata": None, "session_id": None,
            "non_generation_time": 0.0,
            "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                          "completion_token_num": 0},
            "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
        })
    return out


def vlm_dump(path: Any, rollout_id: int, samples: list[dict]) -> None:
    """slime's ``save_debug_rollout_data``: ``torch.save({"rollout_id", "samples"})``."""
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
