"""`forge-replay run FILE`: validate a ForgeReplayJob and replay it on a local Ray.

Kept free of torch/ray imports at module level so `forge-replay --help` stays fast.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
EXIT_EXPECTATIONS = 3
"""The run finished (or was stopped over its memory budget) but an expectation of spec.expect failed."""


_STOPPED_BY: list[int] = []
"""The signal (SIGINT or SIGTERM) that asked the run to stop, once one has."""


def _ignore_further_signals() -> None:
    """The run is stopping and has said how: from here on SIGINT/SIGTERM (a second Ctrl-C) must not cut the
    clean-up short."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


class _Stopped(BaseException):
    """``_Stopped(code)``: a stopped run has cleaned up (engines, trainer, its local Ray) and unwinds to :func:`run`
    with its exit code (``args[0]``); the results folder's lock is released on the way (``_run``'s ``finally``)."""


def _note_further_signals() -> None:
    """The replay is over (its report final, or an error on its way): a SIGINT/SIGTERM now is noted, not acted on, so
    that it cannot cut short the clean-up (Ray's shutdown, the results lock). Re-applied after ray.shutdown(), which
    may leave SIGTERM at its default (seen: a SIGTERM during the clean-up of a finished run killed it, exit -15, with
    the results folder still locked)."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: _STOPPED_BY.append(signum))


def _exit_stopped(code: int) -> None:
    """Exit with 130 / 143 once a stopped run has cleaned up, from :func:`run` only (after every ``finally``). Not
    sys.exit: a stop that landed while Ray or torch was starting could still end the interpreter's own shutdown as a
    death by SIGINT (exit status -2, seen about one time in two when the signal came while the local Ray started),
    which is not what the README promises."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _unraisable_unless_our_stop(unraisable) -> None:
    """sys.unraisablehook during a run: the KeyboardInterrupt of :func:`_stop_run` written off where it landed (inside
    Ray's Cython module's import, Python prints "Exception ignored ... Traceback") is not an error to show: the stop
    is noted and :func:`_stop_point` acts on it. Anything else goes to Python's own hook."""
    if not (issubclass(unraisable.exc_type, KeyboardInterrupt) and _STOPPED_BY):
        sys.__unraisablehook__(unraisable)


def _how_stopped() -> tuple[str, int]:
    """How the run was stopped, for its last line, and its exit status: Ctrl-C 130, SIGTERM 143."""
    import signal

    return ("terminated (SIGTERM)", 143) if _STOPPED_BY and _STOPPED_BY[0] == signal.SIGTERM else \
        ("interrupted (Ctrl-C)", 130)


def _stop_point() -> None:
    """Act on a stop whose KeyboardInterrupt was swallowed where it landed: raised inside a C extension's import
    (Ray's Cython module writes it off as 'Exception ignored') or caught by a library (transformers' lazy import
    turns it into an import error), the run would otherwise go on and exit 0. Called between the run's phases."""
    if _STOPPED_BY:
        raise KeyboardInterrupt


def _stop_run(signum, frame) -> None:
    """Unwind the run on the first SIGINT/SIGTERM (engines and trainer are stopped in its ``finally``); later
    signals are noted and ignored so that the clean-up itself is not cut short.

    KeyboardInterrupt is what Ray's blocking calls expect from a signal handler; it may still surface
    wrapped (a SystemError from inside ray.get), which is why the caller reads ``_STOPPED_BY``."""
    _STOPPED_BY.append(signum)
    if len(_STOPPED_BY) == 1:
        raise KeyboardInterrupt

LOCAL_STATE = ".forge-replay"


def default_dumps_root(claim_name: str) -> str:
    """Where a PVC's contents live locally when --dumps-root is not given."""
    return os.path.join(LOCAL_STATE, "dumps", claim_name)


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
        raise _Unusable(problem)
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


def load_one_job(file: str):
    """The single ForgeReplayJob in ``file`` (a multi-document file may hold other kinds next to it, such as the
    baseline ConfigMap of a GitOps folder: skipped, as ``validate`` skips them); raises _Unusable otherwise."""
    from forge_replay.api import DocumentError, NotAForgeReplayJob, SpecInvalid, load_documents, parse_job
    from forge_replay.api.parse import other_kind

    try:
        docs = load_documents(file)
    except DocumentError as exc:
        raise _Unusable(f"{file}: {exc}") from None
    jobs = [doc for doc in docs if other_kind(doc) is None]  # other kinds (a GitOps folder's ConfigMap): skipped
    if len(jobs) != 1:
        others = f" and {len(docs) - len(jobs)} of other kinds" if len(docs) > len(jobs) else ""
        raise _Unusable(f"{file}: holds {len(jobs)} ForgeReplayJob document(s){others}; `run` takes exactly one "
                        "ForgeReplayJob (other kinds next to it are skipped, as validate skips them)")
    try:
        return parse_job(jobs[0])
    except NotAForgeReplayJob as exc:
        raise _Unusable(f"{file}: {exc}") from None
    except SpecInvalid as exc:
        raise _Unusable("\n".join(f"{file}: {p}" for p in exc.problems)) from None


class _Unusable(Exception):
    pass


def quiet_local_ray() -> None:
    """Say RAY_AUTH_MODE=token, what Ray picks for a new local cluster anyway, so that every run does not print
    Ray's "Token authentication is enabled" warning; a mode the user set is kept. Ray reads the mode once, when it
    is imported: call this before anything imports ray (set later, the local cluster starts without a token)."""
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--dumps-root", type=click.Path(file_okay=False), default=None,
              help="Local folder standing in for the dumps PVC root (default .forge-replay/dumps/<claimName>).")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default=None,
              help="Where report.json, memory.png and progress.json go (default results/<job name>).")
@click.option("--model-root", type=click.Path(file_okay=False), default=None,
              help="Local folder standing in for the model PVC root (spec.model.path is relative to it).")
@click.option("--synth-missing", is_flag=True,
              help="When none of the job's dump files exist, synthesize small slime-format dumps first.")
@click.option("--engine-command", default=None, metavar="CMD",
              help="forge mode: command replacing `python -m sglang.launch_server` (same arguments).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--baseline", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The baseline report.json of spec.expect.baseline, in place of its ConfigMap or PVC.")
@click.option("--trainer-root", type=click.Path(file_okay=False, exists=True), default=None,
              help="backend slime / miles: local folder standing in for spec.trainer.workingDir (the team's script).")
def run(file: str, dumps_root: str | None, results_dir: str | None, model_root: str | None,
        synth_missing: bool, engine_command: str | None, no_progress: bool, baseline: str | None = None,
        trainer_root: str | None = None) -> None:
    """Validate FILE (one ForgeReplayJob) and replay it on a local Ray on this machine.

    The PVC paths of the spec are mapped to local folders (--dumps-root, --model-root). Writes
    report.json (per rollout: loss, tokens, step and data-wait time, memory peaks per rank,
    fallback used), memory.png and progress.json to the results folder and prints a table.
    Exit status: 0 success; 1 the run failed (missing dump, bad sample, trainer error);
    2 FILE is unusable (unreadable, invalid spec, a dumps root or model folder that does not exist, dumps that verify
    refused, forge mode without sglang or --engine-command), or the results folder is (not writable, or in use by
    another run, which is named);
    3 the run finished but an expectation of spec.expect failed (a verdict table follows the run's; a run over
    maxPeakMemoryGiB is stopped after the step that went over);
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM): engines and trainer are stopped either way.
    """
    import signal

    quiet_local_ray()
    _STOPPED_BY.clear()  # a stop noted by an earlier run in this process (in-process callers) is not this run's
    previous = {signum: signal.signal(signum, _stop_run)  # from the first moment: imports, synthesis, Ray's start
                for signum in (signal.SIGINT, signal.SIGTERM)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable_unless_our_stop
    try:
        _run(file, dumps_root, results_dir, model_root, synth_missing, engine_command, no_progress, baseline,
             trainer_root)
    except KeyboardInterrupt:  # before the replay started (after, _replay says how it stopped)
        _ignore_further_signals()
        how, code = _how_stopped()
        click.echo(f"forge-replay run {file}: {how} while starting; nothing was trained", err=True)
        _exit_stopped(code)
    except _Stopped as stopped:  # _replay has said how, and stopped what it started
        _exit_stopped(stopped.args[0])
    finally:  # a run that ended otherwise (called in-process: tests) leaves the caller's handlers as they were
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = previous_hook


def _run(file: str, dumps_root: str | None, results_dir: str | None, model_root: str | None,
         synth_missing: bool, engine_command: str | None, no_progress: bool, baseline: str | None = None,
         trainer_root: str | None = None) -> None:
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    try:
        job = load_one_job(file)
    except _Unusable as exc:
        err(str(exc))
        sys.exit(EXIT_UNUSABLE)
    spec = job.spec
    name = job.metadata.name or "forge-replay"
    dumps_root = dumps_root or default_dumps_root(spec.replay.dumps.claim_name)
    results_dir = results_dir or os.path.join("results", name)
    if model_root is None and spec.model.path:
        model_root = os.path.join(LOCAL_STATE, "models", spec.model.claim_name or "")
    byo = spec.trainer.backend != "builtin" or bool(trainer_root)  # slime / miles: the team's script, a Ray job
    if byo:
        from forge_replay.backends.local import input_problem, run_cli

        problem = input_problem(file, job, trainer_root, dumps_root, synth_missing, err)
        if problem:  # before anything is written, as below
            err(problem)
            sys.exit(EXIT_UNUSABLE)
    else:
        problem = missing_input(spec, dumps_root, model_root, synth_missing)
        if problem:  # before anything is written: no results folder set aside, no dump synthesized
            err(f"{file}: {problem}")
            sys.exit(EXIT_UNUSABLE)
    if spec.replay.mode == "forge" and not byo:  # fail fast, before any dump is synthesized or Ray started
        from forge_replay.runtime.rollout_manager import forge_prerequisite_problem

        problem = forge_prerequisite_problem(engine_command)
        if problem:
            err(f"{file}: {problem}")
            sys.exit(EXIT_UNUSABLE)
    from forge_replay.verdict.run import baseline_problem

    problem = None if byo else baseline_problem(baseline, spec)  # before Ray: a baseline it cannot use is bad input
    if problem:
        err(f"{file}: {problem}")
        sys.exit(EXIT_UNUSABLE)
    from forge_replay.runtime.results import ResultsError, ResultsLock, check_writable, set_previous_aside

    _stop_point()
    lock = ResultsLock(results_dir, name)
    try:  # released however the run ends: an error, a stop (even one that lands while the lock is taken), success
        try:  # a folder that is unwritable, or in use by another run, fails now: not after training
            check_writable(results_dir)
            lock.acquire()
            set_previous_aside(results_dir)
        except ResultsError as exc:
            err(f"{file}: {exc}")
            sys.exit(EXIT_UNUSABLE)
        if lock.note:
            err(f"{file}: {lock.note}")
        if byo:  # the same folder rules as the builtin trainer's: one run at a time, the previous files kept aside
            try:
                code = run_cli(file, job, trainer_root, dumps_root, results_dir, synth_missing, err, model_root)
            except KeyboardInterrupt:  # run_local stopped its Ray head (the job, its workers) on the way out
                _ignore_further_signals()
                how, code = _how_stopped()
                err(f"forge-replay run {file}: {how}; the {spec.trainer.backend} job and its local Ray were stopped; "
                    f"its output so far is in {results_dir}/trainer.log")
                raise _Stopped(code) from None
            sys.exit(code)
        report = _replay(file, job, dumps_root, results_dir, model_root, synth_missing, engine_command, no_progress,
                         baseline)
    finally:
        lock.release()
    from forge_replay.verdict.run import unmet

    if unmet(report):
        err(f"forge-replay run {file}: {unmet(report)}")
        sys.exit(EXIT_EXPECTATIONS)


def _replay(file: str, job, dumps_root: str, results_dir: str, model_root: str | None, synth_missing: bool,
            engine_command: str | None, no_progress: bool, baseline: str | None = None):
    """The run once its results folder is held: dumps, pre-flight checks, Ray, the replay; returns its report."""
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    spec = job.spec
    if synth_missing:
        try:
            synthesize_if_absent(job, dumps_root, err)
        except _Unusable as exc:
            err(f"{file}: {exc}")
            sys.exit(EXIT_UNUSABLE)
        except OSError as exc:
            err(f"{file}: --synth-missing cannot write dumps under {dumps_root}: {exc.strerror or exc} "
                f"({exc.filename or dumps_root})")
            sys.exit(EXIT_FAILED)
    _stop_point()

    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.runtime.driver import ReplayRunError, local_cpus_needed, preflight, run_job
    from forge_replay.runtime.local_ray import LocalRay, LocalRayError
    from forge_replay.runtime.trainer.rank import trainer_settings

    config = RuntimeConfig(job=job, dumps_root=os.path.abspath(dumps_root), results_dir=os.path.abspath(results_dir),
                           model_root=os.path.abspath(model_root) if model_root else None,
                           engine_command=engine_command, progress_configmap=None,
                           baseline_path=os.path.abspath(baseline) if baseline else None)
    try:
        prepared = preflight(config, progress=not no_progress)
    except ReplayRunError as exc:  # before Ray: dumps that verify refuses are unusable input (exit 2)
        err(f"forge-replay run {file}: {exc}")
        sys.exit(EXIT_UNUSABLE if getattr(exc, "unusable", False) else EXIT_FAILED)
    _stop_point()  # the imports above (torch, ray, transformers) are where a stop is most often swallowed
    cpus = local_cpus_needed(trainer_settings(spec.trainer).world_size)
    then = ", then the trainer and the sglang engines" if spec.replay.mode == "forge" else ", then the trainer"
    err(f"starting a local Ray ({cpus} CPUs){then}")
    import signal

    # Ray runs in a session of its own (local_ray): a signal to this process group reaches only this driver.
    # A Ray this process is connected to already (tests) is not ours to start or stop.
    ray_connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    local = None if ray_connected else LocalRay(cpus)
    connected = False
    stopped_code = None
    try:
        if local is not None:  # interrupted half-way, the finally below stops what it started
            try:
                local.start()
                local.connect()
                _stop_point()
            except SystemExit as exc:  # ray.init's own SIGTERM handler: sys.exit(15)
                if exc.code != signal.SIGTERM:
                    raise
                _STOPPED_BY.append(signal.SIGTERM)
                raise KeyboardInterrupt from None
            for signum in (signal.SIGINT, signal.SIGTERM):  # ray.init may replace the SIGTERM handler with its own
                signal.signal(signum, _stop_run)
            _stop_point()
        connected = True
        return run_job(config, fixed_cluster=True, show_progress=not no_progress, prepared=prepared,
                stopped_by=lambda: signal.Signals(_STOPPED_BY[0]).name if _STOPPED_BY else None)
    except BaseException as exc:
        if _STOPPED_BY:
            how_stopped, code = _how_stopped()
            err(f"forge-replay run {file}: {how_stopped} while starting Ray; nothing was trained" if not connected else
                f"forge-replay run {file}: {how_stopped}; engines and trainer stopped; report.json in "
                f"{results_dir} holds the steps finished so far")
            stopped_code = code  # exits after the clean-up below, which ignores further signals
        elif isinstance(exc, (ReplayRunError, LocalRayError)):
            err(f"forge-replay run {file}: {exc}")
            sys.exit(EXIT_FAILED)
        else:
            raise
    finally:
        settle = _ignore_further_signals if stopped_code is not None else _note_further_signals
        settle()
        if local is not None:
            try:
                if "ray" in sys.modules:  # connected, or half-way
                    sys.modules["ray"].shutdown()
            finally:
                settle()
                local.stop()
    if stopped_code is not None:
        raise _Stopped(stopped_code)  # through _run's finally (the results lock) to run(), which exits
