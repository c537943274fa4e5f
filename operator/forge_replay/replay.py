"""Replay semantics (slime's forge_load, made safe and visible) and a slime-compatible rollout function.

- Train rollout N reads ``train_path(template, N)``; when missing and ``fallback_to_first``, the
  rollout-0 file is used, logged and counted (``fallback_count``, ``fallbacks``). Missing with no
  fallback raises ReplayError naming the rollout id and the resolved path.
- Eval N reads ``eval_path(template, N)`` (``eval_N``) with no fallback: a missing eval dump (or a
  literal path) is an empty EvalResult flagged ``missing``.
- Samples keep their own ``rollout_id``: it groups samples for the loss; it is never overwritten.

slime / miles users plug in ``forge_replay.replay.generate_rollout`` with
``--rollout-function-path forge_replay.replay.generate_rollout --load-forge-rollout-data PATH``.
slime defines ``--load-forge-rollout-data`` itself; miles does not, and calls ``add_arguments(parser)`` on
the rollout function it is given, so ``generate_rollout.add_arguments`` adds the flags it reads.
Importing this module needs torch and numpy only (no pydantic, yaml, rich, click, kubernetes).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
from forge_replay.dumps import Sample, load
from forge_replay.dumps.evals import eval_rewards
from forge_replay.dumps.prefetch import Prefetcher
from forge_replay.dumps.verify import resolve
from forge_replay.errors import Portable

logger = logging.getLogger(__name__)

__all__ = [
    "EvalResult",
    "Fallback",
    "Prefetcher",
    "ROLLOUT_FUNCTION_FLAGS",
    "ReplayError",
    "ReplaySource",
    "ReplayedRollout",
    "RolloutFnEvalOutput",
    "RolloutFnTrainOutput",
    "add_arguments",
    "generate_rollout",
]


class ReplayError(Portable, RuntimeError):
    """A training rollout has no dump to replay; the message names the rollout id and resolved path."""

    def __init__(self, rollout_id: int, path: str, message: str):
        self.rollout_id = rollout_id
        self.path = path
        super().__init__(message)


@dataclass
class ReplayedRollout:
    """The samples replayed for training rollout ``rollout_id`` and the file they came from.

    ``dump_rollout_id`` is the ``rollout_id`` stored in the dump; ``file_rollout_id`` the rollout its file
    stands for (``rollout_id``, 0 on a fallback, None for a literal path, which stands for every rollout)."""

    rollout_id: int
    samples: list[Sample]
    path: str
    fallback_used: bool
    dump_rollout_id: int | None = None
    file_rollout_id: int | None = None


@dataclass
class Fallback:
    """One training rollout that replayed rollout 0's file because its own was missing."""

    rollout_id: int
    missing_path: str
    used_path: str


@dataclass
class EvalResult:
    """Replayed eval ``eval_id``; ``missing`` (with ``reason``) when there is no eval dump to replay."""

    eval_id: int
    path: str | None
    samples: list[Sample] = field(default_factory=list)
    missing: bool = False
    reason: str = ""

    def rewards(self, reward_key: str | None = None) -> list[float]:
        """Per-sample eval rewards: dict rewards looked up by ``reward_key``; None counts as 0.0."""
        return eval_rewards(self.samples, reward_key)

    @property
    def truncated(self) -> list[bool]:
        return [Sample.Status(s.status) is Sample.Status.TRUNCATED for s in self.samples]


class ReplaySource:
    """Resolves and loads train / eval dumps under ``root`` following forge_load semantics.

    ``root`` is the dumps mount (``template`` then relative to it, as in the spec), or None/"" to
    use ``template`` as a filesystem path (slime's ``--load-forge-rollout-data``).
    """

    def __init__(self, root: str | None, template: str, fallback_to_first: bool = True):
        problem = path_problem(template if root else template.lstrip("/"))
        if problem:
            raise ValueError(f"dump path {template!r} {problem}")
        self.root = root or None
        self.template = template
        self.fallback_to_first = fallback_to_first
        self.fallbacks: list[Fallback] = []
        self._lock = threading.Lock()

    @property
    def fallback_count(self) -> int:
        return len(self.fallbacks)

    def train_file(self, rollout_id: int) -> str:
        """Resolved path of training rollout ``rollout_id`` (before any fallback)."""
        return resolve(self.root, train_path(self.template, rollout_id))

    def eval_file(self, eval_id: int) -> str | None:
        """Resolved path of eval ``eval_id``, or None for a literal template (no eval dumps)."""
        relative = eval_path(self.template, eval_id)
        return resolve(self.root, relative) if relative is not None else None

    def load_train(self, rollout_id: int) -> ReplayedRollout:
        """Load training rollout ``rollout_id``; a fallback to rollout 0 is logged and counted."""
        path = self.train_file(rollout_id)
        if os.path.exists(path):
            dump = load(path)
            own = rollout_id if is_template(self.template) else None
            return ReplayedRollout(rollout_id, dump.samples, path, False, dump.rollout_id, own)
        if not self.fallback_to_first or not is_template(self.template):
            why = "fallback to rollout 0 is off" if is_template(self.template) else "the literal dump path is missing"
            raise ReplayError(
                rollout_id,
                path,
                f"rollout {rollout_id}: dump {path} does not exist ({why}); "
                "write it or run `forge-replay dumps verify` to list every missing file",
            )
        first = self.train_file(0)
        if not os.path.exists(first):
            raise ReplayError(
                rollout_id,
                path,
                f"rollout {rollout_id}: dump {path} does not exist and neither does the fallback {first} "
                "(rollout 0's file)",
            )
        dump = load(first)
        with self._lock:
            self.fallbacks.append(Fallback(rollout_id, path, first))
            count = len(self.fallbacks)
        logger.warning(
            "rollout %d: dump %s is missing; replaying rollout 0's file %s instead (fallback #%d)",
            rollout_id,
            path,
            first,
            count,
        )
        return ReplayedRollout(rollout_id, dump.samples, first, True, dump.rollout_id, 0)

    def load_eval(self, eval_id: int) -> EvalResult:
        """Load eval ``eval_id`` (``eval_N``); missing -> an empty result flagged ``missing`` (logged)."""
        path = self.eval_file(eval_id)
        if path is None:
            reason = f"the literal dump path {self.template!r} has no eval dumps"
            logger.warning("eval %d: %s; empty eval result", eval_id, reason)
            return EvalResult(eval_id, None, missing=True, reason=reason)
        if not os.path.exists(path):
            reason = f"eval dump {path} does not exist (eval has no fallback)"
            logger.warning("eval %d: %s; empty eval result", eval_id, reason)
            return EvalResult(eval_id, path, missing=True, reason=reason)
        return EvalResult(eval_id, path, samples=load(path).samples)

    def prefetcher(self, rollout_ids: list[int], depth: int = 1) -> Prefetcher[ReplayedRollout]:
        """A Prefetcher loading these training rollouts in the background, in order."""
        return Prefetcher(self.load_train, rollout_ids, depth=depth)


# --- slime / miles rollout-function compatibility -------------------------------------------------


@dataclass
class RolloutFnTrainOutput:
    """Shape of slime's ``RolloutFnTrainOutput`` (used when slime/miles is not running)."""

    samples: list[Any]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    """Shape of slime's ``RolloutFnEvalOutput`` (used when slime/miles is not running)."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def _framework_types() -> tuple[Any, Any, Any | None]:
    """(TrainOutput, EvalOutput, SampleClass) of the framework that loaded us, or our own shapes.

    slime's ``call_rollout_fn`` wraps any output that is not its own class, so when slime (or miles)
    is running we return its classes and its Sample objects. Nothing is imported that is not
    already loaded.
    """
    for framework in ("slime", "miles"):
        if f"{framework}.rollout.base_types" in sys.modules:
            base = sys.modules[f"{framework}.rollout.base_types"]
            types = importlib.import_module(f"{framework}.utils.types")
            return base.RolloutFnTrainOutput, base.RolloutFnEvalOutput, types.Sample
    return RolloutFnTrainOutput, RolloutFnEvalOutput, None


ROLLOUT_FUNCTION_FLAGS: dict[tuple[str, ...], dict[str, Any]] = {
    ("--load-forge-rollout-data",): {
        "type": str,
        "default": None,
        "help": "Dump replayed by forge_replay.replay.generate_rollout: a literal path (every rollout reads it) "
        "or a {rollout_id} template (rollout N reads N, eval N reads eval_N).",
    },
    ("--forge-replay-fallback-to-first",): {
        "action": argparse.BooleanOptionalAction,
        "default": True,
        "help": "A training rollout whose templated dump is missing replays rollout 0's file (counted in the "
        "metrics); --no-forge-replay-fallback-to-first fails instead. Eval never falls back.",
    },
}
"""The flags ``generate_rollout`` reads beyond slime's and miles' own (``reward_key``, ``eval_reward_key``,
``num_rollout``), as ``argparse.add_argument`` arguments."""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add :data:`ROLLOUT_FUNCTION_FLAGS` to ``parser``, leaving alone any flag it already has.

    miles calls ``fn.add_arguments(parser)`` on the rollout function it is given (and rejects unknown flags);
    slime already defines ``--load-forge-rollout-data``, so an existing flag is kept as it is."""
    known = set(parser._option_string_actions)  # argparse's own index of option strings
    for names, options in ROLLOUT_FUNCTION_FLAGS.items():
        spelled = set(names)
        if options.get("action") is argparse.BooleanOptionalAction:
            spelled |= {"--no-" + name[2:] for name in names}
        if spelled & known:
            continue
        parser.add_argument(*names, **options)
    return parser


_SOURCES: dict[tuple[str, bool], ReplaySource] = {}
_SOURCES_LOCK = threading.Lock()


def _source_for(args: Any) -> ReplaySource:
    template = getattr(args, "load_forge_rollout_data", None)
    if not template:
        raise RuntimeError(
            "--load-forge-rollout-data is not set: pass a dump path, literal (rollout_0.pt) "
            "or a template (rollout_{rollout_id}.pt)"
        )
    fallback = bool(getattr(args, "forge_replay_fallback_to_first", True))
    with _SOURCES_LOCK:
        key = (template, fallback)
        if key not in _SOURCES:
            _SOURCES[key] = ReplaySource(None, template, fallback_to_first=fallback)
        return _SOURCES[key]


_PREFETCHERS: dict[int, Prefetcher[ReplayedRollout]] = {}


def _load_train_prefetched(source: ReplaySource, args: Any, rollout_id: int) -> ReplayedRollout:
    """Rollout ``rollout_id``, with the following rollouts (up to ``args.num_rollout``) loading in the
    background while the framework trains on this one. Out-of-order calls just start a new window."""
    total = getattr(args, "num_rollout", None)
    end = total if isinstance(total, int) and total > rollout_id else rollout_id + 1
    with _SOURCES_LOCK:
        prefetcher = _PREFETCHERS.get(id(source))
        if prefetcher is None or not prefetcher.scheduled(rollout_id):
            if prefetcher is not None:
                prefetcher.close()
            prefetcher = source.prefetcher(list(range(rollout_id, end)))
            _PREFETCHERS[id(source)] = prefetcher
    return prefetcher.get(rollout_id)


_NUMERIC_FIELDS = frozenset({
    "tokens", "loss_mask", "rollout_log_probs", "teacher_log_probs", "weight_versions", "multimodal_train_inputs",
    "rollout_routed_experts", "rollout_indexer_topk", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
})
"""Sample fields of numbers, strings and tensors only: they hold no image or record, so they are not walked."""


def _to_framework(samples: list[Sample], sample_cls: Any | None) -> list[Any]:
    """The framework's own Samples (``Sample.from_dict``), with the loader's inert records and images made real
    (miles' ``AdapterRef`` / ``RewardSpec``, PIL images), as the framework's code expects them; it is running, so
    its modules are there."""
    if sample_cls is None:
        return samples
    from forge_replay.dumps.inert import revive

    out = []
    for sample in samples:
        data, seen = sample.to_dict(), {}
        for key, value in data.items():
            if key not in _NUMERIC_FIELDS:
                data[key] = revive(value, seen)
        out.append(sample_cls.from_dict(data))
    return out


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime-compatible rollout function replaying dumps instead of generating.

    Train: ``RolloutFnTrainOutput(samples=[...])`` (flat, as slime's forge_load; samples keep their
    rollout_id), with metrics counting fallbacks. Eval: ``RolloutFnEvalOutput(data={"forge_eval":
    {"rewards", "truncated", "samples"}})``, or ``data={}`` when the eval dump is missing.
    Reads ``args.load_forge_rollout_data``, ``args.eval_reward_key`` / ``args.reward_key`` and the
    optional ``args.forge_replay_fallback_to_first`` (default True, as slime). With ``args.num_rollout``
    the next rollout's dump loads in the background while the framework trains on this one.
    """
    del data_source  # replay needs no prompts
    source = _source_for(args)
    train_cls, eval_cls, sample_cls = _framework_types()
    if evaluation:
        result = source.load_eval(rollout_id)
        if result.missing:
            return eval_cls(data={}, metrics={"forge_replay/eval_missing": 1})
        reward_key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
        return eval_cls(
            data={
                "forge_eval": {
                    "rewards": result.rewards(reward_key),
                    "truncated": result.truncated,
                    "samples": _to_framework(result.samples, sample_cls),
                }
            },
            metrics={"forge_replay/eval_missing": 0},
        )
    replayed = _load_train_prefetched(source, args, rollout_id)
    logger.info(
        "forge-replay: rollout %d replays %d samples from %s%s",
        rollout_id,
        len(replayed.samples),
        replayed.path,
        " (fallback to rollout 0)" if replayed.fallback_used else "",
    )
    metrics = {"forge_replay/fallback_used": int(replayed.fallback_used), "forge_replay/fallbacks": source.fallback_count}
    return train_cls(samples=_to_framework(replayed.samples, sample_cls), metrics=metrics)


generate_rollout.add_arguments = add_arguments  # type: ignore[attr-defined]  # miles' hook for a function's flags
