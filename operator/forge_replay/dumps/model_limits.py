"""A model's ``vocab_size`` and ``max_position_embeddings`` read from its config without importing transformers.

verify needs two integers from a config; importing transformers' config classes for them costs seconds of start-up
(more than loading a dump). For the common decoder model types below the two keys are read from the config dict or
``config.json`` directly, with the defaults transformers' config class applies when a key is absent, so the limits
are those the trainer builds with (tests/unit/test_verify_record.py checks this table against the installed
transformers). The keys read: ``vocab_size`` and ``max_position_embeddings`` (gpt2 also ``n_positions``, which its
config maps to ``max_position_embeddings``); the model type from ``model_type``, else from ``architectures[0]``.
Any other model type (multimodal configs nest their text model's keys) returns None: the caller asks transformers.
"""

from __future__ import annotations

from typing import Any

from forge_replay.dumps.convert import ModelLimits

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


def positive_limit(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None: a limit that is not checked."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
