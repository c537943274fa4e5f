"""Check that every dump a job needs exists, loads safely and converts, before any GPU is requested.

With the job's settings (a :class:`~forge_replay.dumps.convert.Conversion`: the operator's verify Job and
`forge-replay run` always give them), every train dump goes through the trainer's own conversion: dict rewards
without ``replay.rewardKey`` or without that key, token ids outside the model's vocabulary, samples longer than its
positions, response lengths or loss masks that do not fit the tokens, groups that do not split, make the file
unreadable, naming the rollout, file, sample and field. The model's limits come from its config, read without
weights (:func:`model_limits`); a config that cannot be read is noted and those two checks skipped. Without the
job's settings the per-sample checks run alone (:func:`~forge_replay.dumps.convert.check_samples`). Samples with an
all-zero loss mask and a top-level ``rollout_id`` that is not the file's rollout are counted and noted. Eval trains
nothing: an eval dump's rewards are read as the run reports them (:func:`eval_reward_problem`).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Literal

from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
from forge_replay.backends.acceptance import UpstreamSettings, refusals
from forge_replay.dumps.bounds import Limits
from forge_replay.dumps.convert import NO_LIMITS, Conversion, ModelLimits, check_samples, rollout_id_note
from forge_replay.dumps.files import load
from forge_replay.dumps.progress import progress_bar
from forge_replay.dumps.safe_pickle import DumpError
from forge_replay.dumps.sample import Sample, SampleError

Status = Literal["ok", "missing", "fallback", "unreadable"]


def replayed_eval_ids(start_rollout_id: int, num_rollouts: int, eval_interval: int, eval_before_train: bool,
                      backend: str = "builtin") -> list[int]:
    """Every eval a run replays, in order: the one before the first step (when asked for, where ``backend``'s
    train.py evaluates it) and those after rollouts."""
    from forge_replay.replay import eval_before_train_id

    first = eval_before_train_id(start_rollout_id, eval_interval, eval_before_train, backend)
    after = eval_rollout_ids(start_rollout_id, num_rollouts, eval_interval)
    return sorted(set(after) | ({first} if first is not None else set()))


def eval_rollout_ids(start_rollout_id: int, num_rollouts: int, eval_interval: int) -> list[int]:
    """Rollout ids after which eval N runs (reading ``eval_N``): ``(N + 1) % eval_interval == 0``, as slime."""
    if eval_interval <= 0:
        return []
    return [n for n in range(start_rollout_id, start_rollout_id + num_rollouts) if (n + 1) % eval_interval == 0]


def resolve(root: str | None, relative: str) -> str:
    """The filesystem path of a dump path: under ``root`` when given, else as written."""
    return os.path.join(root, relative) if root else relative


@dataclass
class FileCheck:
    """The verdict on one needed dump file."""

    kind: Literal["train", "eval"]
    rollout_id: int
    path: str
    status: Status
    message: str = ""
    samples: int | None = None
    used_path: str | None = None  # the file actually read (the rollout-0 file on fallback)
    masked_out: int | None = None  # samples whose loss mask is all zeros
    rollout_id_mismatch: bool = False  # the dump's rollout_id is not the rollout its file stands for

    @property
    def problem(self) -> bool:
        """A missing eval dump is reported but is not a problem (it replays as an empty eval result)."""
        if self.status == "unreadable":
            return True
        return self.status == "missing" and self.kind == "train"


@dataclass
class VerifyReport:
    """Per-file verdicts; ``ok`` when every training rollout has a loadable dump and no file is corrupt."""

    template: str
    root: str | None
    checks: list[FileCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # checks that were skipped, and why

    @property
    def ok(self) -> bool:
        return not any(c.problem for c in self.checks)

    @property
    def fallbacks(self) -> list[FileCheck]:
        return [c for c in self.checks if c.status == "fallback"]

    @property
    def problems(self) -> list[FileCheck]:
        return [c for c in self.checks if c.problem]

    @property
    def rollout_id_mismatches(self) -> int:
        return sum(1 for c in self.checks if c.rollout_id_mismatch)

    @property
    def masked_out(self) -> int:
        """Samples with an all-zero loss mask, over every distinct file read."""
        seen = {c.used_path: c.masked_out or 0 for c in self.checks if c.used_path}
        return sum(seen.values())

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "template": self.template,
            "root": self.root,
            "fallbacks": len(self.fallbacks),
            "problems": len(self.problems),
            "rollout_id_mismatches": self.rollout_id_mismatches,
            "masked_out_samples": self.masked_out,
            "notes": list(self.notes),
            "files": [asdict(c) | {"problem": c.problem} for c in self.checks],
        }

    def summary(self) -> str:
        """One line per file plus a verdict, for humans and status messages."""
        lines = [f"note: {note}" for note in self.notes]
        for c in self.checks:
            label = f"{c.kind} {c.rollout_id}"
            masked = f", {c.masked_out} with an all-zero loss mask" if c.masked_out else ""
            detail = f" ({c.samples} samples{masked})" if c.samples is not None else ""
            note = f": {c.message}" if c.message else ""
            lines.append(f"{c.status.upper():10} {label:12} {c.path}{detail}{note}")
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        lines.append(
            f"{verdict}; {len(self.fallbacks)} fallback(s) to rollout 0; {self.rollout_id_mismatches} rollout_id"
            f" mismatch(es); {self.masked_out} sample(s) with an all-zero loss mask"
        )
        return "\n".join(lines)


def eval_reward_problem(samples: list, reward_key: str | None, dicts_need_key: bool) -> str:
    """Why an eval dump's rewards cannot be read as the run reads them (None is 0.0, dicts under ``reward_key``),
    or "". Dict rewards without a key are left alone unless ``dicts_need_key`` says the key is the job's."""
    from forge_replay.replay import eval_rewards

    unread = Sample(reward=None)  # a dict reward whose key verify does not know: not read
    readable = samples if reward_key or dicts_need_key else [
        unread if isinstance(s.reward, dict) else s for s in samples]
    try:
        rewards = eval_rewards(readable, reward_key)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return str(exc).strip("'\"")
    bad = next((i for i, r in enumerate(rewards) if not math.isfinite(r)), None)
    return "" if bad is None else f"eval sample {bad}: reward {rewards[bad]} is not a finite number"


def model_limits(source: str | dict, *, builds_from_config: bool = False) -> tuple[ModelLimits, str]:
    """The model's ``vocab_size`` and ``max_position_embeddings`` from its config, read without weights as the trainer
    reads it (a ``spec.model.config`` dict, or transformers' AutoConfig on the checkpoint directory or a name in the
    local cache), and ""; when the config cannot be read, no limits and a note saying so (those checks are skipped:
    a trainer of another image may read what this one cannot).

    ``builds_from_config``: the builtin trainer builds its model from a config dict, so one that transformers refuses
    is the spec's own error and raises ModelError (a ValueError), before Ray starts rather than in the trainer."""
    from forge_replay.runtime.trainer.model import ModelError, config_from_dict

    try:
        if isinstance(source, dict):
            config = config_from_dict(source)
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any reason a config cannot be read is reported, not fatal
        if builds_from_config and isinstance(exc, ModelError):
            raise
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        where = "spec.model.config" if isinstance(source, dict) else source
        return NO_LIMITS, (f"cannot read the model config of {where} ({reason}); token ids and sequence "
                           "lengths were not checked against the model's vocabulary and positions")
    return ModelLimits(_positive(config, "vocab_size"), _positive(config, "max_position_embeddings")), ""


def _positive(config, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def verify_dumps(
    root: str | None,
    template: str,
    num_rollouts: int,
    start_rollout_id: int = 0,
    eval_interval: int = 0,
    eval_before_train: bool = False,
    fallback: bool = True,
    progress: bool = False,
    limits: Limits | None = None,
    reward_key: str | None = None,
    eval_reward_key: str | None = None,
    conversion: Conversion | None = None,
    notes: tuple[str, ...] = (),
    backend: str = "builtin",
    upstream: UpstreamSettings | None = None,
) -> VerifyReport:
    """Check every train (and eval) dump a job reads; each distinct file is loaded once, safely.

    ``root`` is the PVC mount (``template`` must then be relative), or None to use ``template``
    as a filesystem path; ``limits`` bound the work per file (default: :func:`~forge_replay.dumps.bounds.default_limits`).
    With ``conversion`` (the job's settings) every train dump is converted as the trainer converts it, and eval dumps'
    dict rewards are read under ``eval_reward_key`` or the job's reward key (a dict without a key is refused); without
    it the per-sample checks run alone and dict rewards are checked only under ``reward_key``. With
    ``eval_before_train`` (spec.replay.evalBeforeTrain) the eval replayed before the first step is checked too, where
    ``backend``'s train.py evaluates it (miles: at ``start_rollout_id``; slime and builtin: only at 0). ``notes``
    (checks skipped, e.g. an unreadable model config) are carried into the report. With ``upstream`` (a slime / miles job's
    settings) every train dump must also pass that framework's own acceptance rules (backends/acceptance.py), which
    are stricter than forge-replay's trainer in places. Raises ValueError for an invalid template or counts.
    """
    problem = path_problem(template if root else template.lstrip("/"))
    if problem:
        raise ValueError(f"dump path {template!r} {problem}")
    if num_rollouts < 1 or start_rollout_id < 0 or eval_interval < 0:
        raise ValueError("need num_rollouts >= 1, start_rollout_id >= 0, eval_interval >= 0")
    if eval_interval > 0 and not is_template(template):
        raise ValueError(f"eval_interval > 0 needs a {{rollout_id}} template; {template!r} is a literal path")

    report = VerifyReport(template=template, root=root, notes=list(notes))
    if conversion is not None:
        reward_key = conversion.reward_key
    loaded: dict[str, tuple[int | None, str, int | None, int | None]] = {}  # path -> (samples, error, id, masked)
    rollout_ids = range(start_rollout_id, start_rollout_id + num_rollouts)
    eval_ids = replayed_eval_ids(start_rollout_id, num_rollouts, eval_interval, eval_before_train, backend)

    def check(path: str, kind: str) -> tuple[int | None, str, int | None, int | None]:
        if path not in loaded:
            try:
                dump = load(path, limits)
                if kind == "train" and conversion is not None:
                    masked_out = conversion(dump.samples).masked_out
                elif kind == "train":
                    masked_out = check_samples(dump.samples, reward_key)
                else:  # eval trains nothing: only its rewards are read, under eval's own key
                    masked_out = None
                    problem = eval_reward_problem(dump.samples, eval_reward_key or reward_key, conversion is not None)
                    if problem:
                        raise SampleError(None, "reward", problem)
                refused = refusals(dump.samples, upstream) if kind == "train" and upstream is not None else []
                if refused:  # the framework's own acceptance, stricter than forge-replay's trainer here
                    raise SampleError(refused[0].index, refused[0].field, refused[0].problem)
                loaded[path] = (len(dump.samples), "", dump.rollout_id, masked_out)
            except SampleError as exc:
                loaded[path] = (None, str(exc) if exc.where else f"{path}: {exc}", None, None)
            except DumpError as exc:
                loaded[path] = (None, str(exc), None, None)
        return loaded[path]

    def record(kind, n: int, path: str, status: Status, message: str, used: str, expected: int | None) -> None:
        samples, error, inner, masked_out = check(used, kind)
        if error:
            status, message = "unreadable", error
        note = "" if error or inner is None else rollout_id_note(inner, expected)
        if note:
            message = f"{message}; {note}" if message else note
        report.checks.append(FileCheck(kind, n, path, status, message, samples, used, masked_out, bool(note)))

    with progress_bar(progress, num_rollouts + len(eval_ids), "verifying dumps") as advance:
        first = resolve(root, train_path(template, 0))
        for n in rollout_ids:
            path = resolve(root, train_path(template, n))
            used = path
            status: Status = "ok"
            message = ""
            expected = n if is_template(template) else None  # a literal path is every rollout's file
            if not os.path.exists(path):
                if fallback and is_template(template) and os.path.exists(first):
                    used, status, message = first, "fallback", f"missing; rollout 0's file {first} is used instead"
                    expected = 0
                else:
                    hint = "" if fallback or not is_template(template) else " (fallback to rollout 0 is off)"
                    report.checks.append(FileCheck("train", n, path, "missing", f"file does not exist{hint}"))
                    advance(path)
                    continue
            record("train", n, path, status, message, used, expected)
            advance(path)
        for n in eval_ids:
            path = resolve(root, eval_path(template, n) or "")
            if not os.path.exists(path):
                message = "file does not exist: eval replays as an empty result"
                report.checks.append(FileCheck("eval", n, path, "missing", message))
            else:
                record("eval", n, path, "ok", "", path, n)
            advance(path)
    return report
