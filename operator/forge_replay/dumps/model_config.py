"""A model's transformers config from ``spec.model.config``: what the builtin trainer builds its model from, and what
verify reads the model's limits from when it cannot read them itself (:mod:`forge_replay.dumps.model_limits`).

transformers is imported only when a config is built.
"""

from __future__ import annotations


class ModelError(ValueError):
    """The model section cannot be turned into a model; the message says which field and why."""


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
