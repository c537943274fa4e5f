"""The driver: the rollout loop on Ray (rollout manager -> trainer group -> report).

``run_job`` assumes Ray is connected (see :func:`connect_ray`); ``forge-replay run`` (runtime.local_run) and
``python -m forge_replay.runtime`` are thin shells around it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import asdict, dataclass

from forge_replay.runtime.gating import ReplayPlan, plan_replay, plan_weight_sync
from forge_replay.runtime.report import (
    RunReport,
    combine_rank_results,
    headline_gib,
    memory_peak,
    progress_memory,
    render_table,
    stretch_report,
    summarize,
)

log = logging.getLogger(__name__)


ALREADY_CONNECTED = "already connected"


class ReplayRunError(RuntimeError):
    """The run cannot go on; the message says what, where (rollout id, path, sample) and what to do."""


def connect_ray(*, num_cpus: int | None = None) -> str:
    """Join the Ray cluster (``RAY_ADDRESS``, as under a KubeRay RayJob) or start a local Ray.

    Without ``RAY_ADDRESS`` a local Ray is started (never someone else's cluster found by probing; ``forge-replay
    run`` starts its own in runtime/local_ray.py instead). Returns how it connected;
    ``"already connected"`` means the caller did not start Ray and must not shut it down.
    """
    import ray

    if ray.is_initialized():
        return ALREADY_CONNECTED
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):  # a KubeRay RayJob's entrypoint runs with RAY_ADDRESS set
        ray.init(address="auto", logging_level=logging.WARNING)
        return f"joined {os.environ['RAY_ADDRESS']}"
    ray.init(address="local", num_cpus=num_cpus, **quiet)
    return "started a local Ray"


def local_cpus_needed(world_size: int) -> int:
    """Logical CPUs a local Ray needs: one per trainer rank (the manager takes none)."""
    return max(os.cpu_count() or 1, world_size)


def _unwrap(exc: BaseException) -> BaseException:
    """The user's error inside Ray's wrappers (RayTaskError / ActorDiedError)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.*)$")


def actor_error_line(exc: BaseException) -> str:
    """An error raised in an actor as the line it carries: ``ReplayError: rollout 4: dump ... does not exist``.

    An error type that pickle cannot rebuild reaches the caller as Ray's UnserializableException, whose text is a
    link and the original traceback: its last exception line is used, without the traceback."""
    from ray.exceptions import UnserializableException

    cause = _unwrap(exc)
    if isinstance(cause, UnserializableException):
        trace = str(cause).partition("Original exception:\n")[2].strip().splitlines()
        found = [m for m in map(_EXCEPTION_LINE.match, trace) if m]
        return f"{found[-1].group(1)}: {found[-1].group(2)}" if found else (trace[-1] if trace else str(cause))
    return f"{type(cause).__name__}: {cause}" if cause is not exc else str(exc)


@dataclass(frozen=True)
class Prepared:
    """What :func:`preflight` established: the run's plan and where the model comes from."""

    plan: ReplayPlan
    model_source: str | dict
    vocab_size: int | None
    max_positions: int | None = None
    preflight: dict | None = None
    """report.json's ``preflight``: files verified and trusted, seconds (:meth:`VerifyReport.preflight`)."""


def preflight(config, progress: bool = False, plan: ReplayPlan | None = None) -> Prepared:
    """Checks that need no Ray and no trainer: forge prerequisites, model source and limits (and
    spec.replay.stretch.maxTokens within the model's positions), dumps (``verify``).

    Raises :class:`UnusableInput` (a dumps root or model folder that does not exist, a model config the trainer
    cannot build, forge mode without sglang; :class:`DumpsRefused` when verify refuses the dumps) or
    :class:`ReplayRunError`; the CLI and the in-cluster runtime run this before Ray, so bad input fails fast.
    ``progress`` shows verify's progress bar; ``plan`` is the run's (:func:`plan_replay`), planned here when not given.
    """
    from forge_replay.dumps.model_config import ModelError
    from forge_replay.dumps.model_limits import model_limits, position_problems
    from forge_replay.runtime.rollout_manager import forge_prerequisite_problem
    from forge_replay.runtime.trainer.model import model_source

    spec = config.job.spec
    plan = plan if plan is not None else plan_replay(spec)
    if plan.start_engines:
        problem = forge_prerequisite_problem(config.engine_command)
        if problem:
            raise UnusableInput(problem)
    if not os.path.isdir(config.dumps_root):
        raise UnusableInput(f"dumps root {config.dumps_root} does not exist (spec.replay.dumps.claimName "
                            f"{spec.replay.dumps.claim_name!r})")
    try:
        source = model_source(spec.model, config.model_root)
        limits, note = model_limits(source, builds_from_config=True)
    except ModelError as exc:
        raise UnusableInput(str(exc)) from None
    if note:
        log.warning("%s", note)
    # the stretched longest sample is maxTokens long (the spec's, or a sweep point's): refused before Ray
    problems = position_problems(spec, limits.max_positions)
    if problems:
        raise UnusableInput("; ".join(str(problem) for problem in problems))
    checked = None
    if spec.replay.verify:
        checked = verify_or_raise(config, limits, note, progress).preflight()
    else:
        log.info("preflight: spec.replay.verify is false: no dump was checked before the run")
    return Prepared(plan, source, limits.vocab_size, limits.max_positions, checked)


@dataclass
class WarmEngines:
    """What a sweep keeps between its points (runtime/sweep.py): the trainer's placement group and the rollout manager
    (with its engines, once started), for as long as the engine configuration stays the same. A :func:`run_job` given
    them uses them and leaves them running; the sweep stops them (:meth:`stop`)."""

    placement: object
    manager: object
    used: int = 0
    """Points run on them so far: from the second on, the engines' weight-sync group is formed anew."""

    def stop(self) -> None:
        """Stop the manager (its engines) and remove the placement group."""
        _shutdown(self.manager, None, self.placement)

    def alive(self, timeout_s: float = 30.0) -> bool:
        """Whether the rollout manager still answers: Ray's memory monitor may stop several workers at once (Ray 2.56
        and later), so a point whose rank ran out of memory can take the manager with it."""
        import ray

        try:
            ray.get(self.manager.fallback_count.remote(), timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return True


def place_and_manage(config, prepared: Prepared, fixed_cluster: bool) -> tuple[object, object]:
    """Place the trainer's ranks and create the rollout manager (its engines not started yet: ``manager.start``);
    raises :class:`ReplayRunError` when the ranks cannot be placed."""
    import ray

    from forge_replay.runtime.placement import PlacementError, place_trainer
    from forge_replay.runtime.rollout_manager import RolloutManager
    from forge_replay.runtime.trainer.rank import trainer_settings

    settings = trainer_settings(config.job.spec.trainer, deterministic=prepared.plan.deterministic)
    try:
        placement = place_trainer(settings, fixed_cluster=fixed_cluster)
    except PlacementError as exc:
        raise ReplayRunError(str(exc)) from None
    manager = ray.remote(RolloutManager).options(num_cpus=0).remote(
        config.job, config.dumps_root, world_size=settings.world_size, vocab_size=prepared.vocab_size,
        max_positions=prepared.max_positions, engine_command=config.engine_command,
        model_root=config.model_root, results_dir=config.results_dir, trainer_placement=placement,
        plan=prepared.plan.rollout_side,
    )
    return placement, manager


def run_job(config, *, fixed_cluster: bool = False, console=None, show_progress: bool = True,
            prepared: Prepared | None = None, prefetch: bool = True, stopped_by=None,
            warm: WarmEngines | None = None) -> RunReport:
    """Replay ``config.job`` on the connected Ray: every rollout trained, progress published,
    the report written to ``config.results_dir``. Raises :class:`ReplayRunError` with a clear message.

    A run that ran out of memory returns its report (``outcome`` outOfMemory, ``out_of_memory`` the record, ``error``
    its line): that is a memory test's answer, which :func:`forge_replay.runtime.run_inputs.exit_status` turns into
    the exit status (4, or 0 when spec.expect.outcome expects it). Everything it started is stopped all the same.

    ``stopped_by`` (a callable) names the signal that stopped the run (``"SIGTERM"``), or None: an interrupted
    run's report says ``interrupted`` with it.

    ``prefetch=False`` (benchmarks only) requests each rollout after the previous step instead of
    while it trains, to measure what prefetching saves.

    ``warm`` (a sweep's point): the placement and rollout manager (engines) to use, left running at the end; the
    trainer's actors are this run's own, so its memory peak is its own. The table is then the sweep's to print."""
    import ray
    from rich.console import Console

    from forge_replay.api.outcome import RanOutOfMemory
    from forge_replay.runtime.weights.calls import WeightSyncError
    from forge_replay.verdict.run import render_verdict

    console = console or Console(stderr=True)
    started = time.perf_counter()
    run = _ReplayRun(config, prepared or preflight(config), console, show_progress, started)
    report = run.report
    run.starting(f"starting: placing {run.settings.world_size} trainer rank(s)")
    run.progress.start()
    try:
        run.start(fixed_cluster, warm)
        run.train(prefetch, stopped_by)
        run.write_memory_snapshots()
    except (ray.exceptions.RayError, RanOutOfMemory) as exc:  # RanOutOfMemory bare: from a weight push's wait
        if not run.ran_out_of_memory(exc):  # an out-of-memory is the run's answer: reported, not raised
            line = actor_error_line(exc)
            report.error = _brief(exc) if "\n" in line else line
            raise ReplayRunError(line) from None
    except WeightSyncError as exc:  # raised in this process by the weight-sync shell, already one clear line
        report.error = _brief(exc)
        raise ReplayRunError(f"{type(exc).__name__}: {exc}") from None
    except BaseException as exc:
        report.error = _brief(exc) if str(exc) else type(exc).__name__
        raise
    finally:
        run.progress.stop()
        try:  # the clean-up below must not depend on the report being written
            report_problem = run.finish(stopped_by)
        finally:
            if warm is None:
                _shutdown(run.manager, run.group, run.placement, run.board)
            else:  # a sweep's point: its trainer goes, the engines and their placement stay for the next point
                _shutdown(None, run.group, None, run.board)
    if report_problem:
        raise ReplayRunError(report_problem)
    if warm is not None:
        return report
    console.print(render_table(report))
    if report.expectations is not None:
        console.print(render_verdict(report.expectations))
    return report


def _replay_schedule(replay, plan: ReplayPlan) -> tuple[list[int], set[int], int | None]:
    """The rollouts a run trains, the rollouts evaluated after, the eval before the first step; logs which evals."""
    from forge_replay.dumps.evals import eval_before_train_id, eval_note, eval_rollout_ids

    rollout_ids = list(range(replay.start_rollout_id, replay.start_rollout_id + replay.num_rollouts))
    eval_after = set(eval_rollout_ids(replay.start_rollout_id, replay.num_rollouts, replay.eval_interval))
    eval_first = eval_before_train_id(replay.start_rollout_id, replay.eval_interval, replay.eval_before_train)
    note = eval_note(plan.mode, replay.eval_interval, sorted(eval_after), eval_first)
    (log.warning if plan.debug and replay.eval_interval else log.info)("%s", note)
    return rollout_ids, eval_after, eval_first


class _ReplayRun:
    """One :func:`run_job`: its report (saved from the start), progress (published and shown), the actors it
    starts (placement, rollout manager, trainer group, weight sync) and its phases: :meth:`start`, :meth:`train`,
    :meth:`finish`."""

    def __init__(self, config, prepared: Prepared, console, show_progress: bool, started: float):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from forge_replay.runtime.progress_publish import ProgressPublisher
        from forge_replay.dumps.writing import now_rfc3339
        from forge_replay.runtime.trainer.rank import trainer_settings
        from forge_replay.verdict.identity import identity_of

        self.config, self.prepared, self.started = config, prepared, started
        job, spec = config.job, config.job.spec
        self.spec, self.plan = spec, prepared.plan
        self.settings = trainer_settings(spec.trainer, deterministic=self.plan.deterministic)
        self.budget = spec.expect.max_peak_memory_gib if spec.expect is not None else None
        self.rollout_ids, self.eval_after, self.eval_first = _replay_schedule(spec.replay, self.plan)
        self.publisher = ProgressPublisher(config.results_dir, config.progress_configmap, job.metadata.namespace)
        self.report = report = RunReport(
            job=job.metadata.name or "forge-replay", mode=self.plan.mode, world_size=self.settings.world_size,
            device="cuda" if self.settings.use_gpu else "cpu", num_params=0, started_at=now_rfc3339(),
            planned=len(self.rollout_ids),
        )
        report.preflight = prepared.preflight
        self.stretch_tokens = None if spec.replay.stretch is None else spec.replay.stretch.max_tokens
        report.stretch = stretch_report(self.stretch_tokens, [])
        report.identity = identity_of(report.job, spec)
        self.saver = ReportSaver(config.results_dir)
        self.saver.save(report)  # a partial report from the start: no earlier run's report.json passes for this one's
        self.group = self.manager = self.placement = self.syncer = self.board = None
        self.training: int | None = None
        self.multimodal_said = False  # the builtin trainer says once that it trains VLM samples' text only
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"), console=console, disable=not show_progress, transient=False,
        )
        self.task = self.progress.add_task(f"{report.job} ({self.plan.mode})", total=len(self.rollout_ids), info="")

    def publish(self, completed: int) -> None:
        """Publish the progress of ``completed`` steps (progress.json, and the ConfigMap in-cluster)."""
        from forge_replay.api.progress_report import ProgressReport

        rollouts = self.report.rollouts
        self.publisher.publish(ProgressReport(
            completed=completed, total=len(self.rollout_ids), memory=progress_memory(memory_peak(rollouts)),
            fallbacks=sum(r.fallback_used for r in rollouts),
            masked_out_samples=sum(r.masked_out_samples for r in rollouts),
            rollout_id_mismatches=sum(bool(r.rollout_id_mismatch) for r in rollouts),
        ))

    def starting(self, what: str) -> None:
        """Until step 1 trains, the bar says what it waits for."""
        self.progress.update(self.task, info=f"[dim]{what}[/]")

    def start(self, fixed_cluster: bool, warm: WarmEngines | None = None) -> None:
        """Place the trainer, start the rollout manager (and its engines) and the trainer group, set up the weight
        sync; progress 0, then the eval before the first step when there is one. ``warm``: a sweep's placement and
        manager, used (the manager serves this point's job) instead of new ones."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from forge_replay.runtime.environment import environment
        from forge_replay.runtime.trainer.oom import PhaseBoard
        from forge_replay.runtime.trainer.rank import TrainerGroup
        from forge_replay.runtime.weights.sync import EngineWeightSync

        config, spec, settings, plan, report = self.config, self.spec, self.settings, self.plan, self.report
        if warm is None:
            self.placement, self.manager = place_and_manage(config, self.prepared, fixed_cluster)
        else:
            self.placement, self.manager = warm.placement, warm.manager
            ray.get(self.manager.serve_job.remote(config.job, warm.used > 0))  # this point's trainer and data
            warm.used += 1
        manager = self.manager
        rollout_side = manager.start.remote()  # engines start while the trainer does
        self.starting("starting: the trainer" + (f" and {spec.rollout.num_engines} sglang engine(s)"
                                                 if plan.start_engines else ""))
        self.next_batch = manager.get_rollout.remote(self.rollout_ids[0])  # loads while the trainer starts
        self.group = TrainerGroup(settings, self.placement)
        # Each rank's last phase, read after a death: on the driver's node, so that whatever kills a rank for memory
        # on its node (Ray's memory monitor killed the board beside the rank in e2e scenario 8) leaves it alive.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.board = ray.remote(PhaseBoard).options(num_cpus=0, scheduling_strategy=here).remote()
        self.group.watch_memory(self.board, config.results_dir)
        rank0 = self.group.setup(self.prepared.model_source)[0]
        report.num_params = rank0["num_params"]
        report.environment = environment(spec.trainer.seed, rank0["device_name"], settings.world_size,
                                         rank0["deterministic"], rank0.get("threads"), spec)
        if plan.start_engines:
            self.starting(f"starting: waiting for {spec.rollout.num_engines} sglang engine(s)")
        ray.get(rollout_side)
        if plan.start_engines:
            sync_plan = plan_weight_sync(spec.rollout.weight_sync, spec.rollout.colocate, settings.use_gpu)
            log.info("weight sync: %s (%s)", sync_plan.path, sync_plan.reason)
            self.syncer = EngineWeightSync(sync_plan, manager, self.group, config)
        self.publish(0)
        if self.eval_first is not None:  # slime: eval 0 (eval_0) before training, with the engines up
            self.starting(f"eval {self.eval_first} before the first step")
            report.evals.append(ray.get(manager.evaluate.remote(self.eval_first, before_train=True)))

    def train(self, prefetch: bool, stopped_by) -> None:
        """Every rollout trained in turn (the next one loading meanwhile, when ``prefetch``), until the last, a stop,
        or a step over spec.expect.maxPeakMemoryGiB."""
        import ray

        rollout_ids = self.rollout_ids
        with self.progress:
            for step, rollout_id in enumerate(rollout_ids):
                if stopped_by is not None and stopped_by():  # a stop whose KeyboardInterrupt was swallowed
                    raise KeyboardInterrupt
                if step == 0:
                    self.starting(f"step 1: loading rollout {rollout_id}")
                waited = time.perf_counter()
                batch = ray.get(self.next_batch)
                data_wait = time.perf_counter() - waited
                if self.plan.start_engines and self.spec.rollout.colocate:  # before the prefetch: it would queue
                    ray.get(self.manager.before_train_step.remote(step))  # engines release the shared GPUs
                if prefetch and step + 1 < len(rollout_ids):
                    self.next_batch = self.manager.get_rollout.remote(rollout_ids[step + 1])  # loads meanwhile
                self._warn_about(batch, rollout_id)
                record = self._train_step(step, rollout_id, batch, data_wait)
                if self.report.stopped_early:  # over spec.expect.maxPeakMemoryGiB: stop now, the verdict says why
                    log.warning("%s", self.report.stopped_early)
                    break
                if not prefetch and step + 1 < len(rollout_ids):
                    self.next_batch = self.manager.get_rollout.remote(rollout_ids[step + 1])
                self.progress.update(self.task, advance=1, info=f"loss {record.loss:.4f}"
                                     + (" [yellow]fallback[/]" if record.fallback_used else ""))

    def _warn_about(self, batch, rollout_id: int) -> None:
        """Say what slime accepts in a rollout but a user should know: a fallback, a mismatched rollout id,
        all-masked samples, multimodal inputs (once)."""
        if batch.fallback_used:
            log.warning("rollout %d: dump missing, trained on rollout 0's file %s (fallbackToFirst)",
                        rollout_id, batch.path)
        if batch.rollout_id_mismatch or batch.masked_out:  # slime accepts both; the report counts them
            log.warning("rollout %d (%s): %s", rollout_id, batch.path, "; ".join(filter(None, (
                batch.rollout_id_mismatch,
                f"{batch.masked_out} sample(s) with an all-zero loss mask" if batch.masked_out else ""))))
        if batch.multimodal_ignored and not self.multimodal_said:
            self.multimodal_said = True
            log.warning("rollout %d (%s): %d sample(s) hold multimodal inputs (images, pixel_values); the builtin"
                        " trainer trains their text tokens and ignores the rest (said once; the report counts"
                        " multimodal_ignored_samples)", rollout_id, batch.path, batch.multimodal_ignored)

    def _train_step(self, step: int, rollout_id: int, batch, data_wait: float):
        """Train one rollout, push the weights to the engines, evaluate when due, publish and save; returns the
        step's record (``report.stopped_early`` says when it went over the memory budget)."""
        import ray

        from forge_replay.verdict.checks import over_memory_budget

        report = self.report
        if step == 0:
            self.starting("step 1: training")
        began = time.perf_counter()
        self.training = rollout_id  # what a rank's death names when its phase board cannot
        results = ray.get(self.group.train_step_async(step, batch.rank_batches, batch.loss_tokens, rollout_id))
        record = combine_rank_results(step, batch, [r.to_dict() for r in results], data_wait,
                                      time.perf_counter() - began)
        report.rollouts.append(record)
        report.completed = step + 1
        report.stretch = stretch_report(self.stretch_tokens, report.rollouts)
        if step == 0:
            report.time_to_first_step_seconds = time.perf_counter() - self.started
        if self.syncer is not None:
            if step == 0:
                self.starting("step 1: pushing the weights to the engines")
            synced = time.perf_counter()
            self.syncer.after_step(step)
            record.weight_sync_seconds = time.perf_counter() - synced
        if rollout_id in self.eval_after:  # slime: after rollout N when (N + 1) % evalInterval == 0
            report.evals.append(ray.get(self.manager.evaluate.remote(rollout_id)))
        self.publish(step + 1)
        self.saver.save(report, step_done=True)
        report.stopped_early = over_memory_budget(asdict(record), self.budget)
        return record

    def ran_out_of_memory(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised while the run trained) says the run ran out of memory: a rank's allocator error
        (:class:`~forge_replay.api.outcome.RanOutOfMemory` from its phase), or a rank killed by Ray's memory monitor
        or the kernel's OOM killer (runtime/rank_deaths.py). If so the report records it (``out_of_memory``, with
        the last complete step's peak per rank; ``error``: its line)."""
        from forge_replay.api.outcome import RanOutOfMemory
        from forge_replay.dumps.writing import now_rfc3339

        cause = exc  # through every wrapper: a rank's error can reach here inside another actor's (the disk push)
        while not isinstance(cause, RanOutOfMemory) and isinstance(getattr(cause, "cause", None), BaseException):
            cause = cause.cause
        record = cause.record if isinstance(cause, RanOutOfMemory) else None
        if record is None and self.group is not None and self.group.watched:
            from forge_replay.runtime.rank_deaths import rank_out_of_memory

            record = rank_out_of_memory(self.group, self.board)
        if record is None:
            return False
        if self.report.rollouts and record.how_much.last_step_peak_gib is None:
            record.how_much.last_step_peak_gib = {str(m["rank"]): round(headline_gib(m), 4)
                                                  for m in self.report.rollouts[-1].memory}
        if record.when.at is None:
            record.when.at = now_rfc3339()
        if record.when.rollout is None and record.where.component == "trainer":
            record.when.rollout = self.training
        self.report.out_of_memory = record.model_dump(mode="json")
        self.report.error = record.line()
        return True

    def write_memory_snapshots(self) -> None:
        """spec.trainer.memorySnapshot on GPUs: each rank's CUDA memory snapshot into the results folder."""
        if self.spec.trainer.memory_snapshot and self.settings.use_gpu and self.config.results_dir:
            self.report.files["memory_snapshots"] = self.group.write_memory_snapshots(self.config.results_dir)

    def finish(self, stopped_by) -> str | None:
        """However the run ended: how (a stop), the summary, the verdict on a run that finished, the last progress,
        the engines' report; the final report.json and memory.png. Returns the problem of writing them, or None."""
        import ray

        from forge_replay.verdict.outcome import outcome_of
        from forge_replay.verdict.run import verdict

        report, spec = self.report, self.spec
        signal_name = stopped_by() if stopped_by is not None else None
        if signal_name:  # (a run that had run out of memory already keeps that answer: outcome_of reads it first)
            report.interrupted = signal_name
            report.error = report.error if report.out_of_memory else f"interrupted by {signal_name}"
        report.summary = summarize(report.rollouts, report.evals, report.time_to_first_step_seconds)
        report.partial = report.error is not None or report.completed < report.planned
        report.outcome = outcome_of(report.to_dict(), self.budget)
        if report.environment:  # in-cluster: the images the Ray pods ran, as the operator recorded them
            digests = self.publisher.image_digests()
            if digests:
                report.environment["image_digests"] = digests
        judged = report.error is None or (report.out_of_memory is not None and spec.expect is not None
                                          and spec.expect.outcome is not None)
        if judged and spec.expect is not None:  # the verdict on a run that finished (or was stopped, or ran out
            checks, warnings = verdict(report.to_dict(), spec, self.config.baseline_path,  # of memory: its outcome)
                                       self.config.history_root, self.config.results_dir)
            report.expectations = [c.to_dict() for c in checks]
            report.enforced = spec.expect.enforce
            report.warnings += warnings
        self.publish(report.completed)  # a step trained but stopped in its weight push counts in both files
        if self.manager is not None and self.plan.start_engines:
            try:
                report.engines = ray.get(self.manager.engine_report.remote(), timeout=60)
            except Exception as exc:  # noqa: BLE001 - the manager may have died with the error being raised
                log.warning("no engine report: %s", _brief(exc))
        return self.saver.save_final(report)


class ReportSaver:
    """Writes report.json into the results folder: at the start, after steps, and at the end with the plot.

    A write that fails mid-run raises :class:`ReplayRunError` (a run whose results cannot be kept is stopped);
    the final one returns its problem, so that the engines and trainer are stopped first. Between steps a write
    is skipped while the time since the last one is under ten times what it took, which keeps the cost of
    rewriting a long run's report under a tenth of the run."""

    def __init__(self, results_dir: str | None):
        self.directory = results_dir
        self.last_wrote = self.took = 0.0
        self.failed: str | None = None

    def save(self, report: RunReport, step_done: bool = False) -> None:
        from forge_replay.runtime.report import write_json

        if self.directory is None or self.failed:
            return
        if step_done and time.perf_counter() - self.last_wrote < 10 * self.took:
            return
        began = time.perf_counter()
        report.summary = summarize(report.rollouts, report.evals, report.time_to_first_step_seconds)
        try:  # a run killed after this write leaves a report whose summary covers the steps it holds
            if not self.last_wrote:
                os.makedirs(self.directory, exist_ok=True)
            write_json(report, self.directory)
        except OSError as exc:
            self.failed = self._problem(exc, report)
            raise ReplayRunError(self.failed) from None
        self.last_wrote = time.perf_counter()
        self.took = self.last_wrote - began

    def save_final(self, report: RunReport) -> str | None:
        """Write memory.png and report.json; the problem (one line) when that failed, else None."""
        from forge_replay.runtime.report import write_report

        if self.directory is None or self.failed:
            return self.failed
        try:
            write_report(report, self.directory)
        except OSError as exc:
            problem = self._problem(exc, report)
            if report.error is not None:  # the run's own error is what the caller raises: say this one here
                log.error("%s", problem)
            return problem
        return None

    def _problem(self, exc: OSError, report: RunReport) -> str:
        where = exc.filename or self.directory
        return (f"cannot write the report to {self.directory} ({where}: {exc.strerror or exc}); "
                f"the report.json there, if any, is the last one written (partial: true); "
                f"{report.completed} of {report.planned} rollouts were trained")


class UnusableInput(ReplayRunError):
    """The job's input cannot be used (found before Ray starts): `run` and the in-cluster runtime exit 2."""

    unusable = True


class DumpsRefused(UnusableInput):
    """``replay.verify`` refused the dumps: unusable input, found before Ray starts (`run` exits 2)."""


def verify_or_raise(config, limits=None, note: str = "", progress: bool = False):
    """Every needed dump exists, loads safely and converts as the trainer converts it (:class:`Conversion` of the
    job, with the model's ``limits``), before Ray starts or any trainer is placed; raises :class:`DumpsRefused`.

    Files the verify Job's record (``config.verify_record``) holds unchanged under the same settings are trusted, the
    rest verified by worker processes (the CPUs this process may use); one log line says which. Returns the
    :class:`~forge_replay.dumps.verify.VerifyReport`."""
    from forge_replay.dumps.convert import NO_LIMITS, Conversion
    from forge_replay.dumps.verify import VerifyWorkerDied, usable_cpus, verify_dumps

    spec = config.job.spec
    replay = spec.replay
    try:
        result = verify_dumps(
            config.dumps_root, replay.dumps.path, replay.num_rollouts, start_rollout_id=replay.start_rollout_id,
            eval_interval=replay.eval_interval, eval_before_train=replay.eval_before_train,
            fallback=replay.dumps.fallback_to_first, progress=progress,
            eval_reward_key=replay.eval_reward_key, conversion=Conversion.for_job(spec, limits or NO_LIMITS),
            notes=(note,) if note else (), jobs=usable_cpus(), trust=config.verify_record,
        )
    except VerifyWorkerDied as exc:
        raise ReplayRunError(str(exc)) from None
    log.info("%s", result.preflight_line())
    if not result.ok:
        raise DumpsRefused(
            f"dump verification failed under {config.dumps_root} (spec.replay.verify: true):\n{result.summary()}"
        )
    return result


def _brief(exc: BaseException) -> str:
    """One line for a secondary warning: the run's error itself is reported once, in full, by the caller."""
    cause = _unwrap(exc)
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"


def _shutdown(manager, group, placement, board=None) -> None:
    import ray

    if manager is not None:
        try:
            ray.get(manager.shutdown.remote(), timeout=120)
        except Exception as exc:  # noqa: BLE001 - keep shutting the rest down
            log.warning("rollout manager shutdown failed: %s", _brief(exc))
        ray.kill(manager)
    if group is not None:
        group.shutdown()
    if board is not None:
        ray.kill(board)
    if placement is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(placement)
