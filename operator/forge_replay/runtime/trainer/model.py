"""Building the trained model: a transformers causal LM from a config dict (random init) or a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from forge_replay.dumps.model_config import ModelError, config_from_dict

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for the spec's ``trainer.dtype``."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"spec.trainer.dtype: unknown dtype {name!r} (expected one of {', '.join(DTYPES)})") from None


def model_source(model_spec, model_root: str | None) -> str | dict:
    """The checkpoint directory (resolved against ``model_root``) or the config dict to build from."""
    if model_spec.config is not None:
        return dict(model_spec.config)
    if not model_spec.path:
        raise ModelError("spec.model: give exactly one of config and path")
    root = model_root or ""
    path = os.path.join(root, model_spec.path) if root else model_spec.path
    if not Path(path).is_dir():
        raise ModelError(
            f"spec.model.path: checkpoint directory {path!r} does not exist "
            f"(model root {root or '(none)'}, claim {model_spec.claim_name!r}); pass --model-root DIR locally"
        )
    return path


def vocab_size_of(source: str | dict) -> int | None:
    """The model's vocabulary size from its config dict or its checkpoint's config.json."""
    if isinstance(source, dict):
        return getattr(config_from_dict(source), "vocab_size", None)
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(source), "vocab_size", None)


PACKED_ATTENTION = "forge_packed_sdpa"
"""Attention of packed micro-batches: causal sdpa per packed sample, so no [T, T] block mask is ever
built (transformers' sdpa path builds one for packed position ids: 4 GiB at 64k tokens, which would
inflate the very memory peak a forge run measures) and torch can pick its flash kernel on GPUs."""


def packed_causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function for one packed sequence: each sample attends causally to itself only.

    The samples' bounds come from ``cu_seq_lens_q`` (the trainer passes them, read on the host) or else
    from where ``position_ids`` restart at 0. Shapes: [1, heads, T, D] in, [1, T, heads, D] out, like
    transformers' own sdpa function."""
    import torch.nn.functional as F

    from forge_replay.runtime.trainer.batching import segment_bounds

    if query.shape[0] != 1:
        raise ValueError(f"{PACKED_ATTENTION} takes one packed sequence (batch 1), not a batch of {query.shape[0]}")
    gqa = key.shape[1] != query.shape[1]
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is not None:
        bounds = bounds.tolist()
    elif kwargs.get("position_ids") is not None:
        bounds = segment_bounds(kwargs["position_ids"][0].tolist())
    else:
        bounds = [0, query.shape[2]]
    spans = list(zip(bounds[:-1], bounds[1:]))
    parts = [
        F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                       dropout_p=dropout, scale=scaling, enable_gqa=gqa)
        for a, b in spans
    ]
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return out.transpose(1, 2).contiguous(), None


def packed_attention_fits(config) -> bool:
    """Whether every layer is plain full causal attention (no sliding window, no logit soft-capping), the
    only kind :func:`packed_causal_attention` computes; other models keep transformers' sdpa."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(kind != "full_attention" for kind in layer_types):
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    if not layer_types and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


def attention_for(config) -> str:
    """The attention implementation the trainer builds ``config``'s model with."""
    if not packed_attention_fits(config):
        return "sdpa"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_causal_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, lambda *args, **kwargs: None)  # samples split instead
    return PACKED_ATTENTION


def build_model(source: str | dict, *, seed: int, gradient_checkpointing: bool, on_meta: bool = False):
    """Instantiate the causal LM in float32 (FSDP keeps float32 master weights and computes in the
    trainer dtype): random init from ``seed``, or the checkpoint's weights.

    ``on_meta`` builds the structure only (no memory, no init): ranks other than 0 do that and
    receive rank 0's weights after sharding, so a node holds one full copy, not one per GPU.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = config_from_dict(source) if isinstance(source, dict) else AutoConfig.from_pretrained(source)
    attention = attention_for(config)
    if on_meta:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
    elif isinstance(source, dict):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attention, dtype=torch.float32)
    model.config.use_cache = False
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def transformer_blocks(model) -> list[torch.nn.Module]:
    """The decoder layers (each becomes its own FSDP unit)."""
    for owner in (getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    raise ModelError(f"cannot find the decoder layers of {type(model).__name__} (expected model.model.layers)")
