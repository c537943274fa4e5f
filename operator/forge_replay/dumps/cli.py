"""`forge-replay dumps ...`: inspect, verify, synth and pack rollout dumps.

torch is imported only inside commands, so `forge-replay --help` stays fast.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable

import click


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


_limit_option = click.option(
    "--limit",
    "limit_settings",
    multiple=True,
    metavar="NAME=VALUE",
    help="Raise a bound on the work one file may cause (max_depth, max_expansion, max_key_bytes,"
    " max_compression_ratio); repeatable. Default: $FORGE_REPLAY_DUMP_LIMITS, else built-in defaults.",
)


def _limits(settings: tuple[str, ...]):
    from forge_replay.dumps.bounds import LimitError, default_limits

    try:
        return default_limits().with_overrides(settings)
    except LimitError as exc:
        _fail(f"--limit {exc}", code=2)


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


@click.group()
def dumps() -> None:
    """Inspect, verify, synthesize and pack slime/miles rollout dumps (never executes pickled code)."""


@dumps.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_limit_option
def inspect(path: str, as_json: bool, limit_settings: tuple[str, ...]) -> None:
    """Summarize one dump: samples, groups, token lengths, rewards, statuses, optional fields."""
    from rich.console import Console

    from forge_replay.dumps import DumpError, SampleError, load
    from forge_replay.dumps.summary import render_text, summarize

    limits = _limits(limit_settings)
    try:
        with Console(stderr=True).status(f"loading {path}"):
            dump = load(path, limits)
    except (DumpError, SampleError) as exc:
        _fail(str(exc))
    summary = summarize(dump)
    click.echo(json.dumps(summary, indent=2, default=str) if as_json else render_text(summary))


@dumps.command()
@click.option("--path", "template", required=True, help="Dump path: literal, or a {rollout_id} template.")
@click.option("--num-rollouts", type=click.IntRange(min=1), required=True)
@click.option("--start-rollout-id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-interval", type=click.IntRange(min=0), default=0, show_default=True, help="0 = no eval.")
@click.option("--eval-before-train", is_flag=True,
              help="The eval before the first step is replayed too (replay.evalBeforeTrain): check eval_0.")
@click.option("--root", type=click.Path(file_okay=False), default=None, help="Directory the path is relative to.")
@click.option("--no-fallback", is_flag=True, help="A missing train dump is a problem, not a fallback to rollout 0.")
@click.option("--reward-key", default=None, help="Check dict rewards' value under this key too (replay.rewardKey).")
@click.option("--no-reward-key", is_flag=True,
              help="The job has no replay.rewardKey: a dict reward in a train dump is refused, as training refuses it.")
@click.option("--eval-reward-key", default=None,
              help="Check eval dumps' dict rewards under this key (replay.evalRewardKey; default --reward-key).")
@click.option("--n-samples-per-prompt", type=click.IntRange(min=1), default=None,
              help="Group samples as training does (trainer.nSamplesPerPrompt; default: by group_index).")
@click.option("--model", "model_path", default=None, metavar="PATH",
              help="The model's checkpoint directory (spec.model.path): its config.json gives the vocabulary and"
              " positions the tokens must fit (read without weights; unreadable: noted, those checks skipped).")
@click.option("--model-config", default=None, metavar="JSON", help="The model config (spec.model.config), as JSON.")
@click.option("--backend", type=click.Choice(["builtin", "slime", "miles"]), default="builtin", show_default=True,
              help="The trainer (spec.trainer.backend): slime and miles evaluate before training where their train.py"
              " does, and refuse train dumps their own code refuses (see --trainer-args).")
@click.option("--trainer-args", default=None, metavar="JSON",
              help="spec.trainer.args as a JSON list (slime / miles): the settings their acceptance rules read "
              "(--advantage-estimator, --n-samples-per-prompt, ...); --reward-key is the framework's too.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes, each verifying one file at a time (memory: the largest file's times the"
              " workers). Default: the CPUs this process may use (affinity and cgroup quota).")
@click.option("--record", "record_path", default=None, metavar="FILE",
              help="Write what was checked (per file: path, size, mtime, the settings) to FILE, for the runtime's"
              " pre-flight to trust (the operator's verify Job writes it to the results claim).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_limit_option
def verify(
    template: str,
    num_rollouts: int,
    start_rollout_id: int,
    eval_interval: int,
    eval_before_train: bool,
    root: str | None,
    no_fallback: bool,
    reward_key: str | None,
    no_reward_key: bool,
    eval_reward_key: str | None,
    n_samples_per_prompt: int | None,
    model_path: str | None,
    model_config: str | None,
    backend: str,
    trainer_args: str | None,
    jobs: int | None,
    record_path: str | None,
    as_json: bool,
    limit_settings: tuple[str, ...],
) -> None:
    """Check that every needed dump exists, loads safely and converts for training. Exit 0 ok, 1 problems, 2 usage.

    Token ids, log probs and rewards are checked as training checks them; samples with an all-zero
    loss mask and dumps whose rollout_id is not their file's rollout are counted in the report.
    With any of the job's settings (--reward-key, --no-reward-key, --n-samples-per-prompt, --model,
    --model-config) every train dump goes through the trainer's own conversion under them: give them
    all, as the operator's verify Job does (a dict reward without --reward-key is then refused).
    With --backend slime or miles, train dumps must also pass that framework's own acceptance rules.
    """
    from forge_replay.dumps.acceptance import UpstreamSettings
    from forge_replay.dumps.convert import NO_LIMITS, Conversion
    from forge_replay.dumps.model_limits import model_limits
    from forge_replay.dumps.verify import VerifyWorkerDied, usable_cpus, verify_dumps

    upstream = None
    if trainer_args is not None and backend == "builtin":
        _fail("--trainer-args: only with --backend slime or miles", code=2)
    if backend != "builtin":
        try:
            args = json.loads(trainer_args) if trainer_args is not None else []
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ValueError("expected a JSON list of strings")
        except ValueError as exc:
            _fail(f"--trainer-args: {exc}", code=2)
        upstream = UpstreamSettings.from_args(backend, args, reward_key)

    if no_reward_key and reward_key is not None:
        _fail("--no-reward-key and --reward-key contradict each other", code=2)
    if model_path is not None and model_config is not None:
        _fail("--model and --model-config contradict each other", code=2)
    conversion, notes = None, ()
    if reward_key is not None or no_reward_key or n_samples_per_prompt or model_path or model_config:
        limits, note = NO_LIMITS, ""
        try:
            if model_config is not None:
                source = json.loads(model_config)
                if not isinstance(source, dict):
                    raise ValueError("expected a JSON object")
                limits, note = model_limits(source)
            elif model_path is not None:
                limits, note = model_limits(model_path)
        except ValueError as exc:  # not JSON, or not an object
            _fail(f"--model-config: {exc}", code=2)
        conversion = Conversion(n_samples_per_prompt=n_samples_per_prompt, reward_key=reward_key, limits=limits)
        notes = (note,) if note else ()
    try:
        report = verify_dumps(
            root,
            template,
            num_rollouts,
            start_rollout_id=start_rollout_id,
            eval_interval=eval_interval,
            eval_before_train=eval_before_train,
            fallback=not no_fallback,
            progress=not as_json,
            limits=_limits(limit_settings),
            reward_key=reward_key,
            eval_reward_key=eval_reward_key,
            conversion=conversion,
            notes=notes,
            backend=backend,
            upstream=upstream,
            jobs=jobs or usable_cpus(),
        )
    except ValueError as exc:
        _fail(str(exc), code=2)
    except VerifyWorkerDied as exc:
        _fail(str(exc))
    note = closed_to_others(dict.fromkeys(c.used_path for c in report.checks if c.used_path), root)
    if note:
        report.notes.append(note)
    if record_path is not None:
        from forge_replay.dumps.verify_record import record_document, write_record

        try:  # not fatal: without a record the runtime verifies every file itself
            write_record(record_path, record_document(report.settings.to_dict(), report.entries))
            report.notes.append(f"recorded {len(report.entries)} verified file(s) in {record_path}")
        except OSError as exc:
            report.notes.append(f"cannot write the verify record {record_path} ({exc.strerror or exc}): the runtime"
                                " will verify every file again")
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    sys.exit(0 if report.ok else 1)


@dumps.command()
@click.option("--out", "template", required=True, help="Output path: literal, or a {rollout_id} template.")
@click.option("--num-rollouts", type=click.IntRange(min=1), required=True)
@click.option("--prompts", type=click.IntRange(min=1), required=True)
@click.option("--samples-per-prompt", type=click.IntRange(min=1), required=True)
@click.option("--prompt-len", type=click.IntRange(min=1), required=True)
@click.option("--response-len", type=click.IntRange(min=1), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--start-rollout-id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-ids", default="", help="Comma-separated eval ids to write as eval_N files (template only).")
@click.option("--ragged", is_flag=True, help="Vary response lengths in [1, response-len].")
def synth(
    template: str,
    num_rollouts: int,
    prompts: int,
    samples_per_prompt: int,
    prompt_len: int,
    response_len: int,
    seed: int,
    vocab_size: int,
    start_rollout_id: int,
    eval_ids: str,
    ragged: bool,
) -> None:
    """Write slime-format dumps of any shape (raw rewards, grouped samples), e.g. for memory tests."""
    from forge_replay.dumps.synth import write_synth_dumps

    try:
        ids = [int(x) for x in eval_ids.split(",") if x.strip()]
    except ValueError:
        _fail(f"--eval-ids must be comma-separated integers, got {eval_ids!r}", code=2)
    try:
        paths = write_synth_dumps(
            template,
            num_rollouts,
            prompts,
            samples_per_prompt,
            prompt_len,
            response_len,
            seed=seed,
            vocab_size=vocab_size,
            eval_ids=ids,
            start_rollout_id=start_rollout_id,
            ragged=ragged,
            progress=True,
        )
    except ValueError as exc:
        _fail(str(exc), code=2)
    except OSError as exc:
        _fail(f"cannot write dumps: {exc.strerror or exc} ({exc.filename or template})")
    click.echo(f"wrote {len(paths)} dump(s): {paths[0]}{' ...' if len(paths) > 1 else ''}")


@dumps.command()
@click.argument("source")
@click.argument("destination")
@click.option("--num-rollouts", type=click.IntRange(min=1), default=None, help="With {rollout_id} templates.")
@click.option("--start-rollout-id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-ids", default="", help="Comma-separated eval ids to pack too (templates only).")
@click.option("--no-check", is_flag=True, help="Skip reading each packed file back and comparing it.")
@_limit_option
def pack(
    source: str,
    destination: str,
    num_rollouts: int | None,
    start_rollout_id: int,
    eval_ids: str,
    no_check: bool,
    limit_settings: tuple[str, ...],
) -> None:
    """Rewrite dumps in the packed format (flat arrays, memory-mappable); the loader reads it transparently.

    SOURCE and DESTINATION are both literal paths, or both {rollout_id} templates (then give
    --num-rollouts). Missing source files of a template are skipped and reported.
    """
    import os

    from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
    from forge_replay.dumps import DumpError, load_raw
    from forge_replay.dumps.packed import identical, load_packed_raw, write_packed
    from forge_replay.dumps.progress import progress_bar

    limits = _limits(limit_settings)
    for name, value in (("SOURCE", source), ("DESTINATION", destination)):
        problem = path_problem(value.lstrip("/"))
        if problem:
            _fail(f"{name} {value!r} {problem}", code=2)
    if is_template(source) != is_template(destination):
        _fail("SOURCE and DESTINATION must both be literal paths or both {rollout_id} templates", code=2)
    if is_template(source) and num_rollouts is None:
        _fail("--num-rollouts is required with {rollout_id} templates", code=2)
    try:
        ids = [int(x) for x in eval_ids.split(",") if x.strip()]
    except ValueError:
        _fail(f"--eval-ids must be comma-separated integers, got {eval_ids!r}", code=2)
    if is_template(source):
        rollout_ids = range(start_rollout_id, start_rollout_id + (num_rollouts or 0))
        pairs = [(train_path(source, n), train_path(destination, n)) for n in rollout_ids]
        pairs += [(eval_path(source, e) or "", eval_path(destination, e) or "") for e in ids]
    else:
        pairs = [(source, destination)]
    packed, skipped = 0, []
    with progress_bar(True, len(pairs), "packing dumps") as advance:
        for src, dst in pairs:
            if not os.path.exists(src):
                skipped.append(src)
                advance(src)
                continue
            try:
                blob = load_raw(src, limits)
                write_packed(dst, blob["rollout_id"], blob["samples"], blob.get("metadata"))
                del blob
                # A fresh read of both files from disk, compared strictly: the check trusts no memory.
                if not no_check and not identical(load_packed_raw(dst, limits), load_raw(src, limits)):
                    os.unlink(dst)
                    _fail(f"{dst}: packed file does not read back identical to {src}; removed it")
            except DumpError as exc:
                _fail(str(exc))
            packed += 1
            advance(dst)
    click.echo(f"packed {packed} dump(s)" + (f"; skipped missing: {', '.join(skipped)}" if skipped else ""))
    if packed == 0:
        sys.exit(1)

