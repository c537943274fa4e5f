"""Building the trained model: a transformers causal LM from a config dict (random init) or a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ModelError(ValueError):
    """The model section cannot be turned into a model; the message says which field and why."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for the spec's ``trainer.dtype``."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"spec.trainer.dtype: unknown dtype {name!r} (expected one of {', '.join(DTYPES)})") from None


def config_from_dict(config: dict):
    """A transformers ``PretrainedConfig`` from ``spec.model.config``.

    The class comes from ``model_type`` when given, otherwise from the first of ``architectures``.
    """
    import transformers

    values = dict(config)
    model_type = values.pop("model_type", None)
    if model_type:
        try:
            return transformers.AutoConfig.for_model(model_type, **values)
        except ValueError as exc:
            raise ModelError(f"spec.model.config.model_type: {exc}") from None
    architectures = values.get("architectures") or []
    if not architectures:
        raise ModelError("spec.model.config: give model_type or architectures (e.g. [LlamaForCausalLM])")
    model_class = getattr(transformers, architectures[0], None)
    if model_class is None or not hasattr(model_class, "config_class"):
        raise ModelError(f"spec.model.config.architectures[0]: transformers has no model class {architectures[0]!r}")
    return model_class.config_class(**values)


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


def build_model(source: str | dict, *, seed: int, gradient_checkpointing: bool, on_meta: bool = False):
    """Instantiate the causal LM in float32 (FSDP keeps float32 master weights and computes in the
    trainer dtype): random init from ``seed``, or the checkpoint's weights.

    ``on_meta`` builds the structure only (no memory, no init): ranks other than 0 do that and
    receive rank 0's weights after sharding, so a node holds one full copy, not one per GPU.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if on_meta:
        config = config_from_dict(source) if isinstance(source, dict) else AutoConfig.from_pretrained(source)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    elif isinstance(source, dict):
        model = AutoModelForCausalLM.from_config(config_from_dict(source), attn_implementation="sdpa", dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa", dtype=torch.float32)
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
