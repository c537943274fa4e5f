"""The machinery of `forge-replay run FILE` (the command is commands/run.py): how a run is stopped (SIGINT / SIGTERM),
its results folder held, and the builtin trainer's replay on a local Ray (dumps synthesized, pre-flight, Ray, the
replay, the verdict's exit).

Kept free of torch/ray imports at module level so `forge-replay --help` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from forge_replay.runtime.gating import ReplayPlan, plan_replay
from forge_replay.runtime.run_inputs import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNUSABLE,
    RunInputs,
    Unusable,
    err,
    exit_status,
    exit_unusable,
    history_root,
    missing_input,
    synthesize_if_absent,
)

_STOPPED_BY: list[int] = []
"""The signal (SIGINT or SIGTERM) that asked the run to stop, once one has."""


def _ignore_further_signals() -> None:
    """The run is stopping and has said how: from here on SIGINT/SIGTERM (a second Ctrl-C) must not cut the
    clean-up short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


class _Stopped(BaseException):
    """``_Stopped(code)``: a stopped run has cleaned up (engines, trainer, its local Ray) and unwinds to
    :func:`run_stoppable` with its exit code (``args[0]``); the results folder's lock is released on the way
    (:func:`results_held`)."""


def _note_further_signals() -> None:
    """The replay is over (its report final, or an error on its way): a SIGINT/SIGTERM now is noted, not acted on, so
    that it cannot cut short the clean-up (Ray's shutdown, the results lock). Re-applied after ray.shutdown(), which
    may leave SIGTERM at its default (seen: a SIGTERM during the clean-up of a finished run killed it, exit -15, with
    the results folder still locked)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: _STOPPED_BY.append(signum))


def _exit_stopped(code: int) -> None:
    """Exit with 130 / 143 once a stopped run has cleaned up, from :func:`run_stoppable` only (after every
    ``finally``). Not sys.exit: a stop that landed while Ray or torch was starting could still end the interpreter's
    own shutdown as a death by SIGINT (exit status -2, seen about one time in two when the signal came while the local
    Ray started), which is not what the README promises."""
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


def quiet_local_ray() -> None:
    """Say RAY_AUTH_MODE=token, what Ray picks for a new local cluster anyway, so that every run does not print
    Ray's "Token authentication is enabled" warning; a mode the user set is kept. Ray reads the mode once, when it
    is imported: call this before anything imports ray (set later, the local cluster starts without a token)."""
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def run_stoppable(file: str, body: Callable[[], None]) -> None:
    """Run ``body`` (the run of FILE) with SIGINT/SIGTERM stopping it from the first moment (imports, synthesis, Ray's
    start): a stopped run cleans up, says how it stopped and exits 130 (Ctrl-C) or 143 (SIGTERM). A run that ends
    otherwise (called in-process: tests) leaves the caller's handlers as they were."""
    _STOPPED_BY.clear()  # a stop noted by an earlier run in this process (in-process callers) is not this run's
    previous = {signum: signal.signal(signum, _stop_run)  # from the first moment: imports, synthesis, Ray's start
                for signum in (signal.SIGINT, signal.SIGTERM)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable_unless_our_stop
    try:
        body()
    except KeyboardInterrupt:  # before the replay started (after, the replay says how it stopped)
        _ignore_further_signals()
        how, code = _how_stopped()
        err(f"forge-replay run {file}: {how} while starting; nothing was trained")
        _exit_stopped(code)
    except _Stopped as stopped:  # the replay has said how, and stopped what it started
        _exit_stopped(stopped.args[0])
    finally:  # a run that ended otherwise (called in-process: tests) leaves the caller's handlers as they were
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = previous_hook


def stopped_run(file: str, what_was_stopped: str) -> BaseException:
    """A stop that interrupted a run which has stopped what it started (``what_was_stopped`` says what, and where its
    output is): further signals are ignored, one line says how the run stopped. Raise what this returns:
    :func:`run_stoppable` exits 130 / 143 once the results folder is released."""
    _ignore_further_signals()
    how, code = _how_stopped()
    err(f"forge-replay run {file}: {how}; {what_was_stopped}")
    return _Stopped(code)


@contextmanager
def results_held(inputs: RunInputs) -> Iterator[None]:
    """The run's results folder, checked writable and locked, the previous run's files set aside (exit 2 naming the
    folder, or the run that holds it, when it cannot be); released however the run ends: an error, a stop (even one
    that lands while the lock is taken), success."""
    from forge_replay.runtime.results import ResultsError, ResultsLock, check_writable, set_previous_aside

    _stop_point()
    lock = ResultsLock(inputs.results_dir, inputs.name)
    try:
        try:  # a folder that is unwritable, or in use by another run, fails now: not after training
            check_writable(inputs.results_dir)
            lock.acquire()
            set_previous_aside(inputs.results_dir)
        except ResultsError as exc:
            exit_unusable(f"{inputs.file}: {exc}")
        if lock.note:
            err(f"{inputs.file}: {lock.note}")
        yield
    finally:
        lock.release()


def checked_builtin_inputs(inputs: RunInputs) -> ReplayPlan:
    """The plan of a builtin trainer's run whose input is usable; exits 2 before anything is written (no results
    folder set aside, no dump synthesized, no Ray) when a dumps root or model folder does not exist, forge mode
    cannot start engines here, or the --baseline cannot be used."""
    from forge_replay.verdict.run import baseline_problem

    spec = inputs.job.spec
    problem = missing_input(spec, inputs.dumps_root, inputs.model_root, inputs.synth_missing)
    if problem:
        exit_unusable(f"{inputs.file}: {problem}")
    plan = plan_replay(spec)
    if plan.start_engines:  # fail fast, before any dump is synthesized or Ray started
        from forge_replay.runtime.rollout_manager import forge_prerequisite_problem

        problem = forge_prerequisite_problem(inputs.engine_command)
        if problem:
            exit_unusable(f"{inputs.file}: {problem}")
    problem = baseline_problem(inputs.baseline, spec)  # before Ray: a baseline it cannot use is bad input
    if problem:
        exit_unusable(f"{inputs.file}: {problem}")
    return plan


def replay_locally(inputs: RunInputs, plan: ReplayPlan):
    """The builtin trainer's run once its results folder is held: dumps (--synth-missing), pre-flight checks, a local
    Ray, the replay; returns its report. Exits 1 or 2 on an error, said in one line."""
    if inputs.synth_missing:
        _synthesize(inputs)
    _stop_point()

    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.runtime.driver import ReplayRunError, local_cpus_needed, preflight
    from forge_replay.runtime.local_ray import LocalRay
    from forge_replay.runtime.trainer.rank import trainer_settings

    spec = inputs.job.spec
    config = RuntimeConfig(job=inputs.job, dumps_root=os.path.abspath(inputs.dumps_root),
                           results_dir=os.path.abspath(inputs.results_dir),
                           model_root=os.path.abspath(inputs.model_root) if inputs.model_root else None,
                           engine_command=inputs.engine_command, progress_configmap=None,
                           baseline_path=os.path.abspath(inputs.baseline) if inputs.baseline else None,
                           history_root=history_root(inputs))
    try:
        prepared = preflight(config, progress=not inputs.no_progress, plan=plan)
    except ReplayRunError as exc:  # before Ray: dumps that verify refuses are unusable input (exit 2)
        err(f"forge-replay run {inputs.file}: {exc}")
        sys.exit(EXIT_UNUSABLE if getattr(exc, "unusable", False) else EXIT_FAILED)
    _stop_point()  # the imports above (torch, ray, transformers) are where a stop is most often swallowed
    cpus = local_cpus_needed(trainer_settings(spec.trainer).world_size)
    then = ", then the trainer and the sglang engines" if plan.start_engines else ", then the trainer"
    err(f"starting a local Ray ({cpus} CPUs){then}")
    # Ray runs in a session of its own (local_ray): a signal to this process group reaches only this driver.
    # A Ray this process is connected to already (tests) is not ours to start or stop.
    ray_connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    return _replay_on_ray(inputs, config, prepared, None if ray_connected else LocalRay(cpus))


def _synthesize(inputs: RunInputs) -> None:
    """--synth-missing: the job's dumps when none exist (exit 2 when they would fill the disk, 1 when they cannot be
    written)."""
    try:
        synthesize_if_absent(inputs.job, inputs.dumps_root, err)
    except Unusable as exc:
        exit_unusable(f"{inputs.file}: {exc}")
    except OSError as exc:
        err(f"{inputs.file}: --synth-missing cannot write dumps under {inputs.dumps_root}: {exc.strerror or exc} "
            f"({exc.filename or inputs.dumps_root})")
        sys.exit(EXIT_FAILED)


def _replay_on_ray(inputs: RunInputs, config, prepared, local):
    """Start the ``local`` Ray (None: this process is connected to a Ray already) and replay on it; stop it however
    the replay ends. A stop says how the run stopped and raises :class:`_Stopped` after the clean-up."""
    from forge_replay.runtime.driver import ReplayRunError
    from forge_replay.runtime.sweep import run_replay
    from forge_replay.runtime.local_ray import LocalRayError

    file = inputs.file
    connected = False
    stopped_code = None
    try:
        if local is not None:  # interrupted half-way, the finally below stops what it started
            _start_local_ray(local)
        connected = True
        return run_replay(config, fixed_cluster=True, show_progress=not inputs.no_progress, prepared=prepared,
                       stopped_by=lambda: signal.Signals(_STOPPED_BY[0]).name if _STOPPED_BY else None)
    except BaseException as exc:
        if _STOPPED_BY:
            how_stopped, code = _how_stopped()
            err(f"forge-replay run {file}: {how_stopped} while starting Ray; nothing was trained" if not connected else
                f"forge-replay run {file}: {how_stopped}; engines and trainer stopped; report.json in "
                f"{inputs.results_dir} holds the steps finished so far")
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
        raise _Stopped(stopped_code)  # through results_held (the results lock) to run_stoppable, which exits


def _start_local_ray(local) -> None:
    """Start the local Ray and connect to it, with this run's signal handlers (again) in place."""
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


def exit_by_outcome(inputs: RunInputs, report) -> None:
    """Exit 4 naming where, when and how much when the run ran out of memory (0 when spec.expect.outcome expects it),
    3 naming what failed when the run finished but an expectation of spec.expect did not hold; else return."""
    code, why = exit_status(report)
    if code == EXIT_OK and report.outcome == "outOfMemory":
        err(f"forge-replay run {inputs.file}: ran out of memory, as spec.expect.outcome expects: {report.error}")
    elif code != EXIT_OK:
        err(f"forge-replay run {inputs.file}: {why}")
        sys.exit(code)
    elif why:  # a verdict not met in shadow mode: said, not enforced
        err(f"forge-replay run {inputs.file}: warning: {why}")
