"""`forge-replay dumps ...`: inspect, verify, synth and pack rollout dumps.

torch is imported only inside commands, so `forge-replay --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from forge_replay.dumps.verify_request import UsageError, VerifyRequest, limits_of, run_verify


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
    try:
        return limits_of(settings)
    except UsageError as exc:
        _fail(str(exc), code=2)


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
@click.option("--stretch-max-tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stretch each train dump's samples so its longest is N tokens, as training does "
              "(spec.replay.stretch.maxTokens), and check the stretched samples.")
@click.option("--model", "model_path", default=None, metavar="PATH",
              help="The model's checkpoint directory (spec.model.path): its config.json gives the vocabulary and"
              " positions the tokens must fit (read without weights; unreadable: noted, those checks skipped).")
@click.option("--model-config", default=None, metavar="JSON", help="The model config (spec.model.config), as JSON.")
@click.option("--backend", type=click.Choice(["builtin", "slime", "miles"]), default="builtin", show_default=True,
              help="The trainer (spec.trainer.backend): slime and miles evaluate before training where their train.py"
              " does, and refuse train dumps their own code refuses (see --trainer-args).")
@click.option("--trainer-args", default=None, metavar="JSON",
              help="The trainer's argv as a JSON list (slime / miles): spec.trainer.args and the flags forge-replay "
              "injects that their acceptance rules read (--actor-num-nodes, --actor-num-gpus-per-node, fault "
              "tolerance, the debug loader), with --advantage-estimator, --global-batch-size, ... from the args; "
              "--reward-key is the framework's too.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes, each verifying one file at a time (memory: the largest file's times the"
              " workers). Default: the CPUs this process may use (affinity and cgroup quota).")
@click.option("--record", "record_path", default=None, metavar="FILE",
              help="Write what was checked (per file: path, size, mtime, the settings) to FILE, for the runtime's"
              " pre-flight to trust (the operator's verify Job writes it to the results claim), with the notes of"
              " what slime / miles would drop, which their report.json's preflight carries.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_limit_option
def verify(**options: Any) -> None:
    """Check that every needed dump exists, loads safely and converts for training. Exit 0 ok, 1 problems, 2 usage.

    Token ids, log probs and rewards are checked as training checks them; samples with an all-zero
    loss mask and dumps whose rollout_id is not their file's rollout are counted in the report.
    With any of the job's settings (--reward-key, --no-reward-key, --n-samples-per-prompt, --stretch-max-tokens,
    --model, --model-config) every train dump goes through the trainer's own conversion under them: give them
    all, as the operator's verify Job does (a dict reward without --reward-key is then refused).
    With --backend slime or miles, train dumps must also pass that framework's own acceptance rules.
    """
    sys.exit(run_verify(VerifyRequest(**options)))


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
    from forge_replay.dumps.progress_bars import progress_bar

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

