"""TEST DOUBLES of what slime and miles do around a rollout function (neither can be installed here).

Written from upstream, not copied; each piece names the file and commit it follows:

- slime ``THUDM/slime`` @ 624b824a898ab0ec1fcb4d373004c7f3852bf515, miles ``radixark/miles`` @
  31f1ca961a94cb860cec3b2dea34ec332bfa8f76.
- ``Sample.from_dict`` (slime/utils/types.py, miles/utils/types.py, the same in both): a copy of the dict whose
  ``status`` string becomes ``Sample.Status``, ``spec_info`` / ``prefix_cache_info`` dicts their dataclasses
  (missing keys 0); dataclass fields go to the constructor, every other key is set as an attribute.
- The output classes (``{slime,miles}/rollout/base_types.py``): ``RolloutFnTrainOutput(samples, metrics=None)``
  and ``RolloutFnEvalOutput(data, metrics=None)``. miles wraps any other returned object as the samples (train)
  or the data (eval): ``call_rollout_fn`` in miles/rollout/base_types.py and ``LegacyRolloutFnAdapter`` in
  miles/rollout/inference_rollout/compatibility.py (a plain function given as --rollout-function-path).
- miles' argument parsing (miles/utils/arguments.py, ``add_user_provided_function_arguments``): a first
  ``parse_known_args`` finds ``--rollout-function-path`` and ``--custom-generate-function-path``, each is
  imported (``ModuleNotFoundError`` / ``ValueError`` skipped), its ``add_arguments(parser)`` is called when it
  has one, and the final ``parse_args`` refuses every flag nobody added. slime (slime/utils/arguments.py)
  defines ``--load-forge-rollout-data`` itself and calls no rollout function's ``add_arguments``.

``install(monkeypatch, framework)`` puts ``<framework>.rollout.base_types`` and ``<framework>.utils.types`` into
``sys.modules``, as they are in a running trainer. This module imports nothing from forge_replay.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
MILES_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"


def sample_class(framework: str) -> type:
    """A ``Sample`` dataclass whose ``from_dict`` behaves as ``framework``'s (see the module doc)."""

    @dataclass
    class Sample:
        group_index: int | None = None
        index: int | None = None
        rollout_id: int | None = None
        prompt: Any = ""
        tokens: list[int] = field(default_factory=list)
        response: str = ""
        response_length: int = 0
        label: str | None = None
        reward: Any = None
        loss_mask: list[int] | None = None
        rollout_log_probs: list[float] | None = None

        class Status(Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        status: Status = Status.PENDING
        metadata: dict = field(default_factory=dict)

        @dataclass
        class SpecInfo:
            spec_accept_token_num: int = 0
            spec_draft_token_num: int = 0
            spec_verify_ct: int = 0
            completion_token_num: int = 0

        spec_info: SpecInfo = field(default_factory=SpecInfo)

        @dataclass
        class PrefixCacheInfo:
            cached_tokens: int = 0
            total_prompt_tokens: int = 0

        prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

        @staticmethod
        def from_dict(data: dict) -> Sample:
            data = dict(data)
            data["status"] = Sample.Status(data["status"])
            for key, cls in (("spec_info", Sample.SpecInfo), ("prefix_cache_info", Sample.PrefixCacheInfo)):
                given = data.get(key, {})
                data[key] = cls(**{f.name: given.get(f.name, 0) for f in fields(cls)})
            names = {f.name for f in fields(Sample)}
            sample = Sample(**{k: v for k, v in data.items() if k in names})
            for key, value in data.items():
                if key not in names:
                    setattr(sample, key, value)
            return sample

    Sample.__qualname__ = Sample.__name__ = f"{framework.capitalize()}Sample"
    return Sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[Any]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def install(monkeypatch, framework: str) -> types.SimpleNamespace:
    """Make ``framework`` (slime or miles) look loaded: its output classes and its Sample, each its own."""
    base = types.ModuleType(f"{framework}.rollout.base_types")
    base.RolloutFnTrainOutput = type(f"{framework}TrainOutput", (RolloutFnTrainOutput,), {})
    base.RolloutFnEvalOutput = type(f"{framework}EvalOutput", (RolloutFnEvalOutput,), {})
    utils_types = types.ModuleType(f"{framework}.utils.types")
    utils_types.Sample = sample_class(framework)
    for name in (framework, f"{framework}.rollout", f"{framework}.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.setitem(sys.modules, utils_types.__name__, utils_types)
    return types.SimpleNamespace(base_types=base, Sample=utils_types.Sample)


def miles_call_rollout_fn(base_types: types.ModuleType, fn, args, rollout_id: int, data_source: Any,
                          evaluation: bool) -> Any:
    """miles calling a plain rollout function: anything not its own output class is wrapped whole."""
    output = fn(args, rollout_id, data_source, evaluation=evaluation)
    if not isinstance(output, (base_types.RolloutFnTrainOutput, base_types.RolloutFnEvalOutput)):
        output = base_types.RolloutFnEvalOutput(data=output) if evaluation else base_types.RolloutFnTrainOutput(
            samples=output)
    return output


def _load_function(path: str | None):
    if not path:
        return None
    module, _, attr = path.rpartition(".")
    if not module:
        raise ValueError(f"not a dotted path: {path!r}")
    return getattr(importlib.import_module(module), attr)


def miles_parse_args(argv: list[str]) -> argparse.Namespace:
    """miles' parsing of ``argv`` with a few of its own flags; unknown flags exit 2, as in miles."""
    parser = argparse.ArgumentParser(prog="miles")
    parser.add_argument("--rollout-function-path", type=str, default=None)
    parser.add_argument("--custom-generate-function-path", type=str, default=None)
    parser.add_argument("--num-rollout", type=int, default=None)
    parser.add_argument("--reward-key", type=str, default=None)
    parser.add_argument("--eval-reward-key", type=str, default=None)
    partial, _ = parser.parse_known_args(argv)
    standard = "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn"
    for path in (partial.rollout_function_path or standard, partial.custom_generate_function_path):
        try:
            fn = _load_function(path)
        except (ModuleNotFoundError, ValueError):
            continue
        if fn is not None and callable(getattr(fn, "add_arguments", None)):
            fn.add_arguments(parser)
    return parser.parse_args(argv)


def slime_parser() -> argparse.ArgumentParser:
    """The part of slime's parser that matters here: it defines --load-forge-rollout-data itself."""
    parser = argparse.ArgumentParser(prog="slime")
    parser.add_argument("--rollout-function-path", type=str, default="slime.rollout.sglang_rollout.generate_rollout")
    parser.add_argument("--load-forge-rollout-data", type=str, default=None, help="slime's own definition")
    return parser
