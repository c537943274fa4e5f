"""A model's ``vocab_size`` and ``max_position_embeddings`` from its config, read without weights (:func:`model_limits`).

verify needs two integers from a config; importing transformers' config classes for them costs seconds of start-up
(more than loading a dump). For the common decoder model types below the two keys are read from the config dict or
``config.json`` directly, with the defaults transformers' config class applies when a key is absent, so the limits
are those the trainer builds with (tests/unit/test_verify_record.py checks this table against the installed
transformers). The keys read: ``vocab_size`` and ``max_position_embeddings`` (gpt2 also ``n_positions``, which its
config maps to ``max_position_embeddings``); the model type from ``model_type``, else from ``architectures[0]``.
Any other model type (multimodal configs nest their text model's keys) is read through transformers.

:func:`position_problems` checks a spec's stretch (its own and its sweep points') against those positions; for an
inline config :func:`inline_position_problems` does it before anything is launched. Not imported in a trainer image
(it reads the spec's pydantic models): :mod:`~forge_replay.dumps.stretch` holds what the trainer needs.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from forge_replay.api.names import Problem
from forge_replay.api.sweep import axis_values
from forge_replay.dumps.convert import NO_LIMITS, ModelLimits
from forge_replay.dumps.model_config import ModelError, config_from_dict
from forge_replay.dumps.stretch import STRETCH_FIELD, too_long

if TYPE_CHECKING:
    from forge_replay.api import ForgeReplayJobSpec

TYPE_DEFAULTS: dict[str, tuple[int, int]] = {
    # model_type: (vocab_size, max_position_embeddings) of transformers' config class when the keys are absent
    "llama": (32000, 2048),
    "mistral": (32000, 131072),
    "mixtral": (32000, 131072),
    "qwen2": (151936, 32768),
    "qwen2_moe": (151936, 32768),
    "qwen3": (151936, 32768),
    "qwen3_moe": (151936, 32768),
    "qwen3_next": (151936, 32768),
    "gemma": (256000, 8192),
    "gemma2": (256000, 8192),
    "gemma3_text": (262208, 131072),
    "phi3": (32064, 4096),
    "deepseek_v2": (102400, 2048),
    "deepseek_v3": (129280, 4096),
    "glm4": (151552, 131072),
    "glm4_moe": (151552, 131072),
    "gpt_oss": (201088, 131072),
    "olmo2": (50304, 2048),
    "granite": (32000, 2048),
    "gpt2": (50257, 1024),
}

ARCHITECTURES: dict[str, str] = {
    # architectures[0] -> model_type, as transformers' causal-LM mapping pairs them
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Glm4ForCausalLM": "glm4",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss",
    "Olmo2ForCausalLM": "olmo2",
    "GraniteForCausalLM": "granite",
    "GPT2LMHeadModel": "gpt2",
}

POSITION_ALIASES: dict[str, str] = {"gpt2": "n_positions"}
"""Model types whose config stores max_position_embeddings under another key (its attribute_map)."""


def model_type_of(config: dict[str, Any]) -> str | None:
    """``model_type``, else the type of ``architectures[0]`` when it is one of :data:`ARCHITECTURES`."""
    if config.get("model_type"):
        return config["model_type"] if isinstance(config["model_type"], str) else None
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return ARCHITECTURES.get(architectures[0])
    return None


def limits_from_dict(config: dict[str, Any]) -> ModelLimits | None:
    """The limits a config dict gives for a model type of :data:`TYPE_DEFAULTS` (a key that is present but not a
    positive int gives None: not checked, as the trainer's config would not give one either); None for another
    model type, whose config only transformers can read."""
    model_type = model_type_of(config)
    if model_type not in TYPE_DEFAULTS:
        return None
    vocab_default, positions_default = TYPE_DEFAULTS[model_type]
    alias = POSITION_ALIASES.get(model_type)
    positions_key = alias if alias and alias in config else "max_position_embeddings"
    return ModelLimits(positive_limit(config.get("vocab_size", vocab_default)),
                       positive_limit(config.get(positions_key, positions_default)))


def position_problems(spec: ForgeReplayJobSpec, max_positions: int | None) -> list[Problem]:
    """Where ``spec`` stretches beyond a model of ``max_positions`` positions: its own ``replay.stretch.maxTokens``
    and every value a ``spec.sweep`` axis gives it (each such point would be refused when it ran: refused before
    anything is launched instead). None known: nothing to check."""
    if max_positions is None:
        return []
    problems = []
    if spec.replay.stretch is not None and spec.replay.stretch.max_tokens > max_positions:
        problems.append(Problem(STRETCH_FIELD, too_long(str(spec.replay.stretch.max_tokens), max_positions)))
    for index, axis in enumerate(spec.sweep.axes if spec.sweep is not None else []):
        if axis.field == STRETCH_FIELD.removeprefix("spec."):
            beyond = [value for value in axis_values(axis) if value > max_positions]
            if beyond:
                values = ", ".join(str(value) for value in beyond)
                verb = "are" if len(beyond) > 1 else "is"
                problems.append(Problem(f"spec.sweep.axes[{index}]",
                                        too_long(f"{axis.field} {values}", max_positions, verb)))
    return problems


def inline_position_problems(spec: ForgeReplayJobSpec) -> list[Problem]:
    """What the spec's own inline model config (``spec.model.config``) refuses, read without transformers and without
    any dump: a stretch (the spec's, or a sweep point's) beyond its positions. `forge-replay validate` and the operator
    refuse it before anything is launched, so no GPU is held for a run that cannot start. A config of a type read
    only through transformers, or a checkpoint on a claim, is checked by the pre-flight and the verify Job instead."""
    config = spec.model.config
    limits = limits_from_dict(config) if config is not None else None
    return position_problems(spec, limits.max_positions) if limits is not None else []


def positive_limit(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None: a limit that is not checked."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_limits(source: str | dict, *, builds_from_config: bool = False) -> tuple[ModelLimits, str]:
    """The model's ``vocab_size`` and ``max_position_embeddings`` from its config, read without weights as the trainer
    reads it (a ``spec.model.config`` dict, or the checkpoint directory's config.json), and ""; when the config
    cannot be read, no limits and a note saying so (those checks are skipped: a trainer of another image may read
    what this one cannot).

    The common model types are read without importing transformers (:data:`TYPE_DEFAULTS`);
    others, and a checkpoint given as a name in the local cache, through transformers' AutoConfig.

    ``builds_from_config``: the builtin trainer builds its model from a config dict, so one that transformers refuses
    is the spec's own error and raises ModelError (a ValueError), before Ray starts rather than in the trainer."""
    where = "spec.model.config" if isinstance(source, dict) else source
    try:
        if isinstance(source, dict):
            if builds_from_config:
                config_from_dict(source)  # raises ModelError for a config the trainer cannot build
            data = source
        elif os.path.isdir(source):
            with open(os.path.join(source, "config.json"), encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data, dict):
                raise ValueError(f"config.json holds a {type(data).__name__}, not an object")
        else:
            data = None  # a name in the local cache: transformers knows where
        limits = limits_from_dict(data) if data is not None else None
        if limits is None:
            limits = _limits_through_transformers(source)
    except Exception as exc:  # noqa: BLE001 - any reason a config cannot be read is reported, not fatal
        if builds_from_config and isinstance(exc, ModelError):
            raise
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        return NO_LIMITS, (f"cannot read the model config of {where} ({reason}); token ids and sequence "
                           "lengths were not checked against the model's vocabulary and positions")
    return limits, ""


def _limits_through_transformers(source: str | dict) -> ModelLimits:
    """What transformers' config class says (model types :data:`TYPE_DEFAULTS` does not hold)."""
    if isinstance(source, dict):
        config = config_from_dict(source)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(source, local_files_only=True)
    return ModelLimits(positive_limit(getattr(config, "vocab_size", None)),
                       positive_limit(getattr(config, "max_position_embeddings", None)))
