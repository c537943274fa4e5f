"""What `forge-replay run FILE` works on, and how it ends: its exit codes, its inputs (the one job of FILE, the local
folders standing in for its claims), the checks that refuse unusable input before anything is written, and the
dumps ``--synth-missing`` writes.

Shared by the builtin trainer's run (runtime.local_run) and the slime / miles run (backends.local). Kept free of
torch/ray imports so that `forge-replay --help` stays fast.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
EXIT_EXPECTATIONS = 3
"""The run finished (or was stopped over its memory budget) but an expectation of spec.expect failed."""
EXIT_OUT_OF_MEMORY = 4
"""The run ran out of memory (outcome outOfMemory); 0 when spec.expect.outcome expects it."""

LOCAL_STATE = ".forge-replay"


def exit_status(report) -> tuple[int, str | None]:
    """How a run that returned its report (``RunReport``) exits, and the line that says why (None for 0, but for
    a verdict not met in shadow mode): 4 out of memory (0 when spec.expect.outcome expects it), 3 an expectation of
    spec.expect not met (0 with spec.expect.enforce false: ``forge_replay.verdict.shadow``), else 0."""
    from forge_replay.verdict.outcome import outcome_expected
    from forge_replay.verdict.run import unmet
    from forge_replay.verdict.shadow import shadow_line

    if report.outcome == "outOfMemory":
        if outcome_expected(report.expectations):
            return EXIT_OK, None
        return EXIT_OUT_OF_MEMORY, report.error
    why = unmet(report)
    if why and report.enforced is False:
        return EXIT_OK, shadow_line(why)
    return (EXIT_EXPECTATIONS, why) if why else (EXIT_OK, None)


class Unusable(Exception):
    """The run's input cannot be used (exit 2); the message says what, naming the file."""


def err(message: str) -> None:
    """Say ``message`` on stderr, as every line of a run's own account does."""
    click.echo(message, err=True)


def exit_unusable(message: str) -> NoReturn:
    """Say why the input is unusable and exit 2."""
    err(message)
    sys.exit(EXIT_UNUSABLE)


@dataclass(frozen=True)
class RunInputs:
    """One `forge-replay run FILE`: its job and the local folders standing in for the job's claims."""

    file: str
    job: Any
    """The ForgeReplayJob of FILE (validated)."""
    dumps_root: str
    results_dir: str
    model_root: str | None
    synth_missing: bool = False
    engine_command: str | None = None
    no_progress: bool = False
    baseline: str | None = None
    trainer_root: str | None = None

    @property
    def name(self) -> str:
        return self.job.metadata.name or "forge-replay"

    @property
    def byo(self) -> bool:
        """slime / miles: the team's script runs as a Ray job (backends.local), not the builtin trainer."""
        return self.job.spec.trainer.backend != "builtin" or bool(self.trainer_root)


def resolve_inputs(file: str, *, dumps_root: str | None = None, results_dir: str | None = None,
                   model_root: str | None = None, synth_missing: bool = False, engine_command: str | None = None,
                   no_progress: bool = False, baseline: str | None = None,
                   trainer_root: str | None = None) -> RunInputs:
    """FILE's one job, with the local folders given or their defaults; exits 2 (said on stderr) when FILE is
    unusable."""
    try:
        job = load_one_job(file)
    except Unusable as exc:
        exit_unusable(str(exc))
    spec = job.spec
    name = job.metadata.name or "forge-replay"
    if model_root is None and spec.model.path:
        model_root = os.path.join(LOCAL_STATE, "models", spec.model.claim_name or "")
    return RunInputs(file=file, job=job, dumps_root=dumps_root or default_dumps_root(spec.replay.dumps.claim_name),
                     results_dir=results_dir or default_results_dir(name, spec), model_root=model_root,
                     synth_missing=synth_missing, engine_command=engine_command, no_progress=no_progress,
                     baseline=baseline, trainer_root=trainer_root)


def keeps_history(spec) -> bool:
    """Whether the job compares with its trusted history (spec.expect.baseline.history)."""
    return spec.expect is not None and spec.expect.baseline is not None and spec.expect.baseline.history is not None


def default_results_dir(name: str, spec) -> str:
    """Where a run writes without --results: ``results/<name>`` (the previous run's report set aside there), or for
    a job with spec.expect.baseline.history a new folder per run, ``results/<name>/run-<UTC time>``, so that the
    runs before it stay its history (:func:`history_root`)."""
    if not keeps_history(spec):
        return os.path.join("results", name)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, n = os.path.join("results", name, f"run-{stamp}"), 1
    while os.path.exists(folder):
        n += 1
        folder = os.path.join("results", name, f"run-{stamp}-{n}")
    return folder


def history_root(inputs: RunInputs) -> str | None:
    """The results root whose run folders are the history of a local run with spec.expect.baseline.history: the
    parent of its results folder (its siblings are the earlier runs, laid out as on the claim or flat); None
    without a history."""
    if not keeps_history(inputs.job.spec):
        return None
    return os.path.dirname(os.path.abspath(inputs.results_dir))


def default_dumps_root(claim_name: str) -> str:
    """Where a PVC's contents live locally when --dumps-root is not given."""
    return os.path.join(LOCAL_STATE, "dumps", claim_name)


def load_one_job(file: str):
    """The single ForgeReplayJob in ``file`` (a multi-document file may hold other kinds next to it, such as the
    baseline ConfigMap of a GitOps folder: skipped, as ``validate`` skips them); raises Unusable otherwise."""
    from forge_replay.api import DocumentError, NotAForgeReplayJob, SpecInvalid, load_documents, parse_job
    from forge_replay.api.parse import other_kind

    try:
        docs = load_documents(file)
    except DocumentError as exc:
        raise Unusable(f"{file}: {exc}") from None
    jobs = [doc for doc in docs if other_kind(doc) is None]  # other kinds (a GitOps folder's ConfigMap): skipped
    if len(jobs) != 1:
        others = f" and {len(docs) - len(jobs)} of other kinds" if len(docs) > len(jobs) else ""
        raise Unusable(f"{file}: holds {len(jobs)} ForgeReplayJob document(s){others}; `run` takes exactly one "
                       "ForgeReplayJob (other kinds next to it are skipped, as validate skips them)")
    try:
        return parse_job(jobs[0])
    except NotAForgeReplayJob as exc:
        raise Unusable(f"{file}: {exc}") from None
    except SpecInvalid as exc:
        raise Unusable("\n".join(f"{file}: {p}" for p in exc.problems)) from None


def missing_input(spec, dumps_root: str, model_root: str | None, synth_missing: bool) -> str | None:
    """What the job reads that does not exist (the dumps root, unless --synth-missing writes it; the model folder of
    spec.model.path), or None: unusable input, said before anything is written."""
    if not synth_missing and not Path(dumps_root).is_dir():
        return (f"dumps root {dumps_root} does not exist (spec.replay.dumps.claimName "
                f"{spec.replay.dumps.claim_name!r}); pass --dumps-root DIR, or --synth-missing to synthesize dumps")
    if spec.model.path:
        folder = os.path.join(model_root, spec.model.path) if model_root else spec.model.path
        if not Path(folder).is_dir():
            return (f"spec.model.path: checkpoint directory {folder} does not exist (model root {model_root}, claim "
                    f"{spec.model.claim_name!r}); pass --model-root DIR")
    return None


def synth_shape(job) -> dict:
    """The shape of the dumps ``--synth-missing`` writes: small, and within the model's vocabulary."""
    spec = job.spec
    vocab = None
    if spec.model.config is not None:
        vocab = spec.model.config.get("vocab_size")
    return {
        "prompts": 4,
        "samples_per_prompt": spec.trainer.n_samples_per_prompt or 4,
        "prompt_len": 16,
        "response_len": 48,
        "vocab_size": min(int(vocab), 32000) if vocab else 32000,
        "seed": spec.trainer.seed,
    }


def synthesize_if_absent(job, dumps_root: str, echo) -> list[str]:
    """Write synthetic dumps when *none* of the job's dump files exist (a fresh machine).

    If some exist, nothing is written: filling gaps would hide the fallback a user may be testing.
    """
    from forge_replay.api.dump_path import is_template, train_path
    from forge_replay.dumps.synth import write_synth_dumps
    from forge_replay.dumps.evals import replayed_eval_ids

    replay = job.spec.replay
    template = replay.dumps.path
    ids = range(replay.start_rollout_id, replay.start_rollout_id + replay.num_rollouts)
    needed = {os.path.join(dumps_root, train_path(template, n)) for n in ids}
    if any(os.path.exists(p) for p in needed):
        return []
    shape = synth_shape(job)
    start = replay.start_rollout_id if is_template(template) else 0
    eval_ids = replayed_eval_ids(replay.start_rollout_id, replay.num_rollouts, replay.eval_interval,
                                 replay.eval_before_train, job.spec.trainer.backend)
    target = os.path.join(dumps_root, template)
    # the first dump tells how large they all are, before the disk fills up
    written = write_synth_dumps(target, 1, start_rollout_id=start, **shape)
    files = replay.num_rollouts + len(eval_ids) if is_template(template) else 1
    problem = synth_disk_problem(os.path.getsize(written[0]), files, shutil.disk_usage(written[0]).free, dumps_root)
    if problem:
        os.unlink(written[0])
        raise Unusable(problem)
    if files > 1:
        written += write_synth_dumps(target, replay.num_rollouts - 1, eval_ids=eval_ids, start_rollout_id=start + 1,
                                     progress=True, **shape)
    echo(f"synthesized {len(written)} dump(s) under {dumps_root} "
         f"({shape['prompts']} prompts x {shape['samples_per_prompt']} samples, "
         f"{shape['prompt_len']}+{shape['response_len']} tokens)")
    return written


SYNTH_CAP_BYTES = 2**30
"""--synth-missing writes smoke-test dumps: at most 1 GiB of them (real dumps come from a real run)."""


def synth_disk_problem(dump_bytes: int, files: int, free_bytes: int, where: str) -> str | None:
    """Why ``files`` synthesized dumps of ``dump_bytes`` each must not be written (over 1 GiB, or over half
    the free disk), or None."""
    need = dump_bytes * files
    limit = min(SYNTH_CAP_BYTES, free_bytes // 2)
    if need <= limit:
        return None
    bound = ("the 1 GiB --synth-missing writes at most" if limit == SYNTH_CAP_BYTES
             else f"half of the {free_bytes / 2**30:.2f} GiB free under {where}")
    return (f"--synth-missing would write {files} dumps of {dump_bytes / 2**20:.2f} MiB each "
            f"({need / 2**30:.2f} GiB), more than {bound}; lower spec.replay.numRollouts (a literal dumps.path "
            "reuses one file), or write the dumps with `forge-replay dumps synth`")
