"""A request to verify a job's dumps: what `forge-replay dumps verify` is asked, its command line, and the run.

:class:`VerifyRequest` holds the command's options. :meth:`VerifyRequest.for_job` asks what a ForgeReplayJob needs
checked (its dumps, eval schedule, reward keys, grouping, backend and model), and :meth:`VerifyRequest.argv` writes
a request as the command line: :func:`verify_command` is the pre-flight Job's (the operator renders it).
:func:`run_verify` runs a request as the command does, printing what it prints, and returns its exit status (0 ok,
1 problems, 2 usage): `forge-replay dumps verify` and `forge-replay run --trainer-root` both call it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from forge_replay.api.paths import DUMPS_MOUNT, MODEL_MOUNT

if TYPE_CHECKING:
    from forge_replay.api import ForgeReplayJob

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class VerifyRequest:
    """The options of `forge-replay dumps verify`, named as the command names them (JSON options as their text)."""

    template: str
    num_rollouts: int
    start_rollout_id: int = 0
    eval_interval: int = 0
    eval_before_train: bool = False
    root: str | None = None
    no_fallback: bool = False
    reward_key: str | None = None
    no_reward_key: bool = False
    eval_reward_key: str | None = None
    n_samples_per_prompt: int | None = None
    stretch_max_tokens: int | None = None
    model_path: str | None = None
    model_config: str | None = None
    backend: str = "builtin"
    trainer_args: str | None = None
    jobs: int | None = None
    record_path: str | None = None
    as_json: bool = False
    limit_settings: tuple[str, ...] = ()

    @classmethod
    def for_job(cls, job: ForgeReplayJob, dumps_root: str = DUMPS_MOUNT, model_root: str | None = MODEL_MOUNT,
                in_pod: bool = True, record: str | None = None) -> VerifyRequest:
        """What the pre-flight Job checks of ``job``: its dumps under ``dumps_root``, with the job's settings, so that
        every train dump goes through the trainer's own conversion (dict rewards under the keys training and eval
        read, a dict reward without rewardKey refused; groups as trainer.nSamplesPerPrompt makes them; tokens within
        the model's vocabulary and positions, from its config) and, for slime / miles, the framework's own eval
        before training and acceptance rules, on the team's args and the flags forge-replay injects that they read
        (frameworks/batch.verify_flags). In the pod one worker per CPU it requests; with ``in_pod=False`` the CPUs of
        this machine (`forge-replay run` of a slime / miles job). The verify record is written to ``record`` when
        given (the controller knows where; `forge-replay run` into its results folder). ``model_root`` None leaves a
        model path out (its limits are then not checked)."""
        from forge_replay.frameworks.batch import verify_flags

        replay, trainer, model = job.spec.replay, job.spec.trainer, job.spec.model
        byo = trainer.backend != "builtin"
        argv = [*trainer.args, *verify_flags(job.spec, f"{dumps_root.rstrip('/')}/{replay.dumps.path}")] if byo else []
        return cls(
            template=replay.dumps.path,
            num_rollouts=replay.num_rollouts,
            start_rollout_id=replay.start_rollout_id,
            eval_interval=replay.eval_interval,
            eval_before_train=replay.eval_before_train,
            root=dumps_root,
            no_fallback=not replay.dumps.fallback_to_first,
            reward_key=replay.reward_key or None,
            no_reward_key=not replay.reward_key,
            eval_reward_key=replay.eval_reward_key or None,
            n_samples_per_prompt=trainer.n_samples_per_prompt or None,
            stretch_max_tokens=None if replay.stretch is None else replay.stretch.max_tokens,
            model_path=(f"{model_root}/{model.path}" if model.config is None and model.path and model_root is not None
                        else None),
            model_config=None if model.config is None else json.dumps(model.config, sort_keys=True,
                                                                      separators=(",", ":")),
            backend=trainer.backend,
            trainer_args=json.dumps(argv, separators=(",", ":")) if byo else None,
            jobs=replay.verify_resources.cpus if in_pod else None,
            record_path=record or None,
        )

    def argv(self) -> list[str]:
        """The request as the command line `forge-replay dumps verify ...` (options left at their default omitted)."""
        command = ["forge-replay", "dumps", "verify"]
        if self.root is not None:
            command += ["--root", self.root]
        command += ["--path", self.template, "--num-rollouts", str(self.num_rollouts)]
        command += _option("--start-rollout-id", self.start_rollout_id or None)
        command += _option("--eval-interval", self.eval_interval or None)
        command += _flag("--eval-before-train", self.eval_before_train) + _flag("--no-fallback", self.no_fallback)
        command += _option("--reward-key", self.reward_key) + _flag("--no-reward-key", self.no_reward_key)
        command += _option("--eval-reward-key", self.eval_reward_key)
        command += _option("--n-samples-per-prompt", self.n_samples_per_prompt)
        command += _option("--stretch-max-tokens", self.stretch_max_tokens)
        command += _option("--backend", None if self.backend == "builtin" else self.backend)
        command += _option("--trainer-args", self.trainer_args)
        command += _option("--model-config", self.model_config) + _option("--model", self.model_path)
        command += _option("--jobs", self.jobs) + _option("--record", self.record_path)
        for setting in self.limit_settings:
            command += ["--limit", setting]
        return command + _flag("--json", self.as_json)


def _option(flag: str, value: Any) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _flag(flag: str, given: bool) -> list[str]:
    return [flag] if given else []


def verify_command(job: ForgeReplayJob, dumps_root: str = DUMPS_MOUNT, model_root: str | None = MODEL_MOUNT,
                   in_pod: bool = True, record: str | None = None) -> list[str]:
    """The `forge-replay dumps verify` command line of the pre-flight Job (:meth:`VerifyRequest.for_job`)."""
    return VerifyRequest.for_job(job, dumps_root, model_root, in_pod, record).argv()


class UsageError(ValueError):
    """The request contradicts itself or gives an option that cannot be read; exit status 2."""


def run_verify(request: VerifyRequest) -> int:
    """Verify the dumps ``request`` names as `forge-replay dumps verify` does, printing what it prints (the report on
    stdout, an error on stderr); returns the exit status: 0 ok, 1 problems, 2 usage."""
    from forge_replay.dumps.verify import VerifyWorkerDied

    try:
        report = _verified(request)
    except UsageError as exc:
        return _failed(str(exc), EXIT_USAGE)
    except VerifyWorkerDied as exc:
        return _failed(str(exc), EXIT_PROBLEMS)
    note = closed_to_others(dict.fromkeys(c.used_path for c in report.checks if c.used_path), request.root)
    if note:
        report.notes.append(note)
    if request.record_path is not None:
        _record(report, request.record_path)
    click.echo(json.dumps(report.to_dict(), indent=2) if request.as_json else report.summary())
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _failed(message: str, code: int) -> int:
    click.echo(f"error: {message}", err=True)
    return code


def _verified(request: VerifyRequest) -> Any:
    """The :class:`~forge_replay.dumps.verify.VerifyReport` of ``request``; raises UsageError, VerifyWorkerDied."""
    from forge_replay.dumps.verify import usable_cpus, verify_dumps

    upstream = _upstream_settings(request)
    if request.no_reward_key and request.reward_key is not None:
        raise UsageError("--no-reward-key and --reward-key contradict each other")
    if request.model_path is not None and request.model_config is not None:
        raise UsageError("--model and --model-config contradict each other")
    conversion, notes = _conversion(request)
    limits = limits_of(request.limit_settings)
    try:
        return verify_dumps(
            request.root, request.template, request.num_rollouts, start_rollout_id=request.start_rollout_id,
            eval_interval=request.eval_interval, eval_before_train=request.eval_before_train,
            fallback=not request.no_fallback, progress=not request.as_json, limits=limits,
            reward_key=request.reward_key, eval_reward_key=request.eval_reward_key, conversion=conversion,
            notes=notes, backend=request.backend, upstream=upstream, jobs=request.jobs or usable_cpus(),
        )
    except ValueError as exc:  # an invalid template or counts
        raise UsageError(str(exc)) from None


def _upstream_settings(request: VerifyRequest) -> Any:
    """A slime / miles job's acceptance settings (:class:`~forge_replay.dumps.acceptance.UpstreamSettings`) from
    --trainer-args, or None for the builtin trainer; raises UsageError."""
    from forge_replay.dumps.acceptance import UpstreamSettings

    if request.trainer_args is not None and request.backend == "builtin":
        raise UsageError("--trainer-args: only with --backend slime or miles")
    if request.backend == "builtin":
        return None
    try:
        args = json.loads(request.trainer_args) if request.trainer_args is not None else []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("expected a JSON list of strings")
    except ValueError as exc:
        raise UsageError(f"--trainer-args: {exc}") from None
    return UpstreamSettings.from_args(request.backend, args, request.reward_key)


def _conversion(request: VerifyRequest) -> tuple[Any, tuple[str, ...]]:
    """The trainer's conversion under the job's settings (:class:`~forge_replay.dumps.convert.Conversion`) and the
    notes of checks skipped (an unreadable model config), or (None, ()) when the request gives none of them."""
    from forge_replay.dumps.convert import NO_LIMITS, Conversion
    from forge_replay.dumps.model_limits import model_limits
    from forge_replay.dumps.stretch import position_problem

    if not (request.reward_key is not None or request.no_reward_key or request.n_samples_per_prompt
            or request.stretch_max_tokens or request.model_path or request.model_config):
        return None, ()
    limits, note = NO_LIMITS, ""
    try:
        if request.model_config is not None:
            source = json.loads(request.model_config)
            if not isinstance(source, dict):
                raise ValueError("expected a JSON object")
            limits, note = model_limits(source)
        elif request.model_path is not None:
            limits, note = model_limits(request.model_path)
    except ValueError as exc:  # not JSON, or not an object
        raise UsageError(f"--model-config: {exc}") from None
    if request.stretch_max_tokens is not None:  # refused once, before any dump is read
        problem = position_problem(request.stretch_max_tokens, limits.max_positions)
        if problem:
            raise UsageError(f"{problem} (--stretch-max-tokens)")
    conversion = Conversion(n_samples_per_prompt=request.n_samples_per_prompt, reward_key=request.reward_key,
                            limits=limits, stretch_max_tokens=request.stretch_max_tokens)
    return conversion, (note,) if note else ()


def limits_of(settings: tuple[str, ...]) -> Any:
    """The loader's bounds (:class:`~forge_replay.dumps.bounds.Limits`) with the ``--limit NAME=VALUE`` settings
    applied; raises UsageError naming the bad one."""
    from forge_replay.dumps.bounds import LimitError, default_limits

    try:
        return default_limits().with_overrides(settings)
    except LimitError as exc:
        raise UsageError(f"--limit {exc}") from None


def _record(report: Any, path: str) -> None:
    """Write the verify record of what passed to ``path``, noting it in the report; not fatal: without a record the
    runtime verifies every file itself."""
    from forge_replay.dumps.verify_record import record_document, write_record

    try:
        write_record(path, record_document(report.settings.to_dict(), report.entries, report.dropped))
        report.notes.append(f"recorded {len(report.entries)} verified file(s) in {path}")
    except OSError as exc:
        report.notes.append(f"cannot write the verify record {path} ({exc.strerror or exc}): the runtime"
                            " will verify every file again")


def closed_to_others(paths: Iterable[str], root: str | None) -> str | None:
    """A note naming the dumps other users cannot read (mode without o+r) and the folders under ``root`` on their
    way that others cannot enter (without o+x), or None. Runtime pods run as their own uid (the operator's
    runtimeUid, 10001 by default), so a dump another uid wrote 0600 to a shared claim fails there."""
    files: dict[str, int] = {}
    folders: dict[str, int] = {}
    for path in paths:
        if (mode := _mode_without(path, stat.S_IROTH)) is not None:
            files[path] = mode
        folder = os.path.dirname(os.path.abspath(path))
        top = os.path.abspath(root) if root else folder
        while folder == top or folder.startswith(top.rstrip(os.sep) + os.sep):
            if (mode := _mode_without(folder, stat.S_IXOTH)) is not None:
                folders[folder] = mode
            if folder == top:
                break
            folder = os.path.dirname(folder)
    if not files and not folders:
        return None

    def listed(found: dict[str, int]) -> str:
        names = [f"{path} ({stat.S_IMODE(mode):04o})" for path, mode in list(found.items())[:3]]
        return ", ".join(names) + (f" and {len(found) - 3} more" if len(found) > 3 else "")

    closed = [f"{len(files)} dump(s) not readable by other users: {listed(files)}" if files else "",
              f"{len(folders)} folder(s) other users cannot enter: {listed(folders)}" if folders else ""]
    return ("; ".join(filter(None, closed)) + "; runtime pods run as their own uid (10001 by default) and cannot"
            " read them on a shared claim: chmod o+r the dumps (o+x the folders)")


def _mode_without(path: str, bit: int) -> int | None:
    """``path``'s mode when it lacks ``bit``; None when it has it or cannot be read."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if mode & bit else mode
