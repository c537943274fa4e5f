"""The forge-mode engine fleet: engines, router, health monitor, weight sync, recovery, eval fleet.

The rollout manager owns one :class:`EngineFleet` when ``plan.start_engines`` and calls its hooks:
``start()``, ``before_generate(rollout_id)``, ``before_train_step(step)``, the weight sync
(``after_train_step(step, weights)`` on the disk path; ``prepare_weight_sync(step)``, then the
trainer's transfer, then ``finish_weight_sync(step, version)`` on the tensor and distributed paths,
see :mod:`forge_replay.runtime.weights.sync`), ``before_eval(eval_id)``, ``report()``, ``shutdown()``.
Every rollout-side decision (monitor, fault injection, recovery, eval self-probe) comes from the
:class:`~forge_replay.runtime.gating.RolloutSidePlan` it is given; nothing here re-derives it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from forge_replay.api.outcome import OutOfMemory, RanOutOfMemory
from forge_replay.api.paths import ENGINE_RAY_RESOURCE
from forge_replay.runtime.engines.actor import EngineInfo, engine_actor_class
from forge_replay.runtime.engines.deaths import engine_alive, gather, out_of_memory, refused_for_memory
from forge_replay.runtime.engines.distributed_push import DistributedPush
from forge_replay.runtime.engines.eval_fleet import EvalFleet
from forge_replay.runtime.engines.faults import FAULTS_ENV, FaultInjector
from forge_replay.runtime.engines.health import HealthMonitor
from forge_replay.runtime.engines.oom import EngineAt
from forge_replay.runtime.engines.process import (
    ENGINE_LOGS,
    ModelSource,
    engine_count,
    prepare_model_source,
    probe_health,
    resolve_engine_command,
    start_run_logs,
)
from forge_replay.runtime.engines.router import Router, plan_router, router_installed
from forge_replay.runtime.gating import RolloutSidePlan, WeightSyncPlan, plan_replay, plan_weight_sync
from forge_replay.runtime.weights.calls import (
    SESSION_BEGIN,
    WeightSyncError,
    begin_weight_update,
    confirm_weights,
    end_weight_update,
    release_memory,
    resume_memory,
)
from forge_replay.runtime.weights.disk import push_weights_from_disk, write_versioned_checkpoint
from forge_replay.runtime.weights.distributed import WeightGroup
from forge_replay.runtime.weights.sync import SyncTarget
from forge_replay.runtime.weights.tensor import EngineGPUs

log = logging.getLogger(__name__)

ROLLOUT_GROUP = "rollout"


def _is_object_ref_box(weights: object) -> bool:
    """True for ``[ObjectRef]``: checkpoint files left in Ray's object store by the trainer (see the driver)."""
    if not (isinstance(weights, list) and len(weights) == 1):
        return False
    import ray

    return isinstance(weights[0], ray.ObjectRef)


def _this_node_ip() -> str | None:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - outside Ray every engine is local
        return None


def _engine_slots() -> float:
    """How many ``ENGINE_RAY_RESOURCE`` the Ray cluster offers (the operator's rollout pods, one each); 0 outside a
    Ray cluster made by the operator (``forge-replay run``'s local Ray)."""
    try:
        import ray

        return ray.cluster_resources().get(ENGINE_RAY_RESOURCE, 0) if ray.is_initialized() else 0
    except Exception:  # noqa: BLE001 - no Ray: no slots
        return 0


class EngineDead(RuntimeError):
    """An engine is dead and rollout fault tolerance is off, so it is not restarted."""


ENGINE_START, ENGINE_SERVING = "engineStart", "engineServing"
"""The phases of an engine's out-of-memory (:data:`forge_replay.api.outcome.OomPhase`)."""


@dataclass(frozen=True)
class FleetSettings:
    """What the fleet needs from the spec, flattened (built by :meth:`EngineFleet.from_job`)."""

    num_engines: int
    gpus_per_engine: int
    colocate: bool
    use_gpus: bool
    engine_args: Mapping[str, str] = field(default_factory=dict)
    health_interval_s: float = 30.0
    health_timeout_s: float = 30.0
    health_first_wait_s: float = 0.0
    startup_timeout_s: float = 900.0
    push_timeout_s: float = 600.0
    gpus_per_node: int = 0
    weight_sync: str = "auto"
    """``spec.rollout.weightSync``, resolved with :func:`plan_weight_sync` (see :attr:`EngineFleet.weight_sync`)."""
    dtype: str | None = None
    """The trainer's dtype (``spec.trainer.dtype``): the engines' ``--dtype`` unless engineArgs set one."""


@dataclass
class _Engine:
    index: int
    actor: object
    info: EngineInfo | None = None
    restarts: int = 0
    stopped_by_monitor: bool = False


class EngineFleet(DistributedPush):
    """All engines of one forge-mode run and everything done to them (the distributed weight push in
    :class:`~forge_replay.runtime.engines.distributed_push.DistributedPush`)."""

    def __init__(
        self,
        settings: FleetSettings,
        plan: RolloutSidePlan,
        command: Sequence[str],
        model: ModelSource,
        work_dir: Path,
        *,
        engine_command_given: bool,
        weights_dir: Path | None = None,
        trainer_placement=None,
    ):
        if not plan.start_engines:
            raise RuntimeError("the rollout-side plan starts no engines (debug mode): no EngineFleet may exist")
        self.settings = settings
        self.plan = plan
        self.command = list(command)
        self.model = model
        self.work_dir = Path(work_dir)
        self.weights_dir = Path(weights_dir) if weights_dir else self.work_dir / "weights"
        self.engine_command_given = engine_command_given
        self.trainer_placement = trainer_placement
        """The trainer's Ray placement group: colocated engines are pinned to the bundles of the ranks whose
        GPUs they share (a 0-resource actor could otherwise land on any node, even one without GPUs)."""
        self.engines: list[_Engine] = []
        self.router: Router | None = None
        self.router_plan = plan_router(settings.num_engines, engine_command_given, router_installed())
        self.monitor: HealthMonitor | None = None
        self.injector: FaultInjector | None = None
        self.faults_ignored = ""
        self.eval_fleet = EvalFleet(self.targets, plan.eval_fleet_self_probe, settings.health_timeout_s)
        self.weight_versions: list[str] = []
        self.unsupported_endpoints: list[str] = []
        self.memory_held_gib: float | None = None
        self._released = False
        self._previous_checkpoint: Path | None = None
        self._node_ip = _this_node_ip()
        self.engine_slots = _engine_slots()
        """Engine slots of the Ray cluster: when there are any, every disaggregated engine takes one, so it runs on
        a rollout pod (with no GPU to ask for, a CPU engine could otherwise land on any pod)."""
        self.weight_sync: WeightSyncPlan = plan_weight_sync(settings.weight_sync, settings.colocate, settings.use_gpus)
        self.generation = 0
        """Bumped whenever engines are (re)started: a distributed push then forms a new weight group."""
        self._weight_group: WeightGroup | None = None
        self._sessions: set[str] = set()
        """Engines with a weight-update session open (:func:`begin_weight_update`)."""
        self._without_sessions: set[str] = set()
        """Engines that answered 404 to /begin_weight_update (sglang before 0.5.21): pushed to without one."""
        self.serving_rollout: int | None = None
        """The rollout being replayed (:meth:`before_generate`): an engine's out-of-memory names it."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_job(
        cls,
        job,
        *,
        engine_command: str | None,
        model_root: str | None,
        work_dir: Path | None = None,
        weights_dir: Path | None = None,
        plan: RolloutSidePlan | None = None,
        startup_timeout_s: float = 900.0,
        trainer_placement=None,
    ) -> EngineFleet:
        """Build the fleet of a validated ForgeReplayJob (fails fast without sglang or --engine-command)."""
        spec = job.spec
        ft = spec.fault_tolerance
        plan = plan or plan_replay(spec).rollout_side
        command = resolve_engine_command(engine_command)
        rollout = spec.rollout
        work_dir = Path(work_dir or tempfile.mkdtemp(prefix=f"forge-replay-{job.metadata.name}-"))
        start_run_logs(work_dir)
        model = prepare_model_source(spec.model.config, spec.model.path, model_root, work_dir)
        health = ft.health_check
        settings = FleetSettings(
            num_engines=engine_count(rollout.num_gpus, rollout.num_gpus_per_engine),
            gpus_per_engine=rollout.num_gpus_per_engine,
            colocate=rollout.colocate,
            use_gpus=spec.trainer.gpus_per_node > 0,
            gpus_per_node=spec.trainer.gpus_per_node,
            engine_args=dict(rollout.engine_args or {}),
            health_interval_s=health.interval_seconds,
            health_timeout_s=health.timeout_seconds,
            health_first_wait_s=health.first_wait_seconds,
            startup_timeout_s=startup_timeout_s,
            weight_sync=rollout.weight_sync,
            dtype=spec.trainer.dtype,
        )
        return cls(
            settings, plan, command, model, work_dir,
            engine_command_given=engine_command is not None, weights_dir=weights_dir,
            trainer_placement=trainer_placement,
        )

    def _actor_options(self, index: int) -> tuple[dict, int | None]:
        """Ray options and colocated base GPU id of engine ``index``."""
        s = self.settings
        # num_cpus=0: an engine actor only waits on its process; it must not take the trainer's CPUs.
        # max_concurrency: a health-triggered kill must not queue behind a long start().
        options: dict = {"num_cpus": 0, "max_concurrency": 4}
        if self.engine_slots and not s.colocate:
            options["resources"] = {ENGINE_RAY_RESOURCE: 1}
        if not s.use_gpus:
            return options, None
        if s.colocate:
            # Colocated engines share the trainer's GPUs: they hold no Ray GPU resource (Ray then leaves
            # CUDA_VISIBLE_DEVICES alone) and pick their GPUs with --base-gpu-id.
            per_node = max(s.gpus_per_node, 1)
            first_gpu = index * s.gpus_per_engine  # the engine's first GPU, counted over the trainer's ranks
            if self.trainer_placement is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=self.trainer_placement, placement_group_bundle_index=first_gpu)
            return options, first_gpu % per_node
        options["num_gpus"] = s.gpus_per_engine
        return options, None

    def _new_actor(self, index: int):
        options, base_gpu = self._actor_options(index)
        return engine_actor_class().options(**options).remote(
            index, self.command, self.model, self.settings.gpus_per_engine, dict(self.settings.engine_args),
            str(self.work_dir / ENGINE_LOGS), colocated_base_gpu_id=base_gpu, use_gpus=self.settings.use_gpus,
            caller_node_ip=self._node_ip, dtype=self.settings.dtype, memory_saver=self.settings.colocate,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Launch every engine, wait for /health_generate, then the router, monitor and injector."""
        log.info("forge mode: starting %d engine(s): %s", self.settings.num_engines, " ".join(self.command))
        self.engines = [_Engine(i, self._new_actor(i)) for i in range(self.settings.num_engines)]
        infos = gather([e.actor.start.remote(self.settings.startup_timeout_s) for e in self.engines],
                       [e.index for e in self.engines], ENGINE_START)
        self.generation += 1
        for engine, info in zip(self.engines, infos, strict=True):
            engine.info = info
            log.info("engine %d healthy at %s (pid %d) after %.1f s", info.index, info.url, info.pid, info.started_in_s)
        log.info("router: %s", self.router_plan.reason)
        if self.router_plan.launch:
            self.router = Router([e.info.url for e in self.engines], self._node_ip or "127.0.0.1", self.work_dir)
            self.router.start()
            self.router.wait_ready(self.settings.startup_timeout_s)
        if self.plan.health_monitors:
            self.monitor = HealthMonitor(
                ROLLOUT_GROUP, self.targets, probe_health, self._stop_failed_engine,
                interval_s=self.settings.health_interval_s, timeout_s=self.settings.health_timeout_s,
                first_wait_s=self.settings.health_first_wait_s,
            )
            self.monitor.start()
        if self.plan.fault_injection:
            self.injector = FaultInjector.from_env(len(self.engines))
        elif self._faults_requested():
            self.faults_ignored = (
                f"${FAULTS_ENV} is set but ignored: fault injection needs faultTolerance.enabled "
                "with rollout in components"
            )
            log.warning(self.faults_ignored)
        self._sample_memory()

    def trainer_replaced(self) -> None:
        """A sweep replaced the trainer's ranks between points: the next distributed push forms a new weight group
        (the engines leave the old one, whose trainer rank is gone)."""
        self.generation += 1

    @staticmethod
    def _faults_requested() -> bool:
        import os

        return bool(os.environ.get(FAULTS_ENV, "").strip())

    def targets(self) -> list[tuple[int, str]]:
        """(index, url) of the engines believed alive (a monitor-stopped one is left out until recovered)."""
        return [(e.index, e.info.url) for e in self.engines if e.info is not None and not e.stopped_by_monitor]

    @property
    def urls(self) -> list[str]:
        return [e.info.url for e in self.engines if e.info is not None]

    def _stop_failed_engine(self, index: int, problem: str) -> None:
        engine = self.engines[index]
        engine.stopped_by_monitor = True
        try:
            import ray

            ray.get(engine.actor.kill.remote())
        except Exception as exc:  # noqa: BLE001 - the actor may be gone already: then so is its engine
            log.warning("stopping engine %d after a failed health check: %s", index, exc)

    def before_generate(self, rollout_id: int) -> None:
        """Replay of rollout ``rollout_id`` starts: monitors resume, unless colocated engines have
        released their memory for training (the driver prefetches the next rollout during training):
        then they resume after the weight sync, when the engines hold their memory again."""
        self.serving_rollout = rollout_id
        if self.monitor is not None and not self._released:
            self.monitor.resume()

    def before_train_step(self, step: int) -> None:
        """Training starts: monitors pause; colocated engines release their GPU memory."""
        if self.monitor is not None:
            self.monitor.pause()
        if self.settings.colocate:
            with self._watching():
                self._each(lambda url: release_memory(url, timeout_s=self.settings.push_timeout_s))
            self._released = True

    def prepare_weight_sync(self, step: int) -> SyncTarget:
        """Before any push: monitors pause, dead engines are recovered (rollout FT) or refused, colocated
        engines take their memory back, and on the distributed and tensor paths every engine opens a weight-update
        session. Returns the version to push and the engines' generation. An engine found dead of an out-of-memory
        raises :class:`RanOutOfMemory` (never restarted: the run's answer is that it does not fit)."""
        if self.monitor is not None:
            self.monitor.pause()
        with self._watching():
            if self.plan.recover_before_weight_sync:
                self._recover_dead_engines()
            else:
                self._require_all_alive(step)
            if self._released:
                self._each(lambda url: resume_memory(url, timeout_s=self.settings.push_timeout_s))
                self._released = False
            if self.weight_sync.path in ("distributed", "tensor"):
                self._each(self._begin_session)
        return SyncTarget(str(len(self.weight_versions) + 1), self.generation,
                          tuple(self.settings.gpus_per_engine for _ in self.engines), self._engine_gpus())

    def _engine_gpus(self) -> tuple[EngineGPUs, ...]:
        """The tensor path: each colocated engine's address, node and GPUs (where its trainer ranks must be)."""
        if self.weight_sync.path != "tensor":
            return ()
        located = []
        for engine in self.engines:
            base_gpu = self._actor_options(engine.index)[1]
            if engine.info is None or base_gpu is None:
                raise WeightSyncError(f"engine {engine.index} has no GPU placement: the tensor weight sync needs "
                                      "colocated engines on GPUs")
            located.append(EngineGPUs(engine.info.url, engine.info.node_ip, base_gpu, self.settings.gpus_per_engine))
        return tuple(located)

    def after_train_step(self, step: int, weights: object) -> str:
        """The disk path: push the new weights to every engine (recovering dead ones first under rollout FT);
        the version.

        ``weights`` is ``[ObjectRef]`` to the trainer's checkpoint files (each engine's node stages them),
        or a model / tensor dict the fleet saves under ``weights_dir`` (only the latest version stays there).
        """
        version = self.prepare_weight_sync(step).version
        if _is_object_ref_box(weights):
            # The trainer's files are in Ray's object store: each engine's node stages its own copy.
            import ray

            staged = ray.get([e.actor.stage_checkpoint.remote(weights[0], int(version)) for e in self.engines])
            paths = {e.info.url: Path(path) for e, path in zip(self.engines, staged)}
            checkpoint = None
        else:
            config = self.model.config if self.model.from_config else None
            checkpoint = write_versioned_checkpoint(weights, self.weights_dir, int(version), config=config)
            paths = {url: checkpoint for url in self.urls}
        with self._watching():
            results = self._each(lambda url: self._refused_for_memory(
                url, push_weights_from_disk, url, paths[url], version, timeout_s=self.settings.push_timeout_s))
        if checkpoint is not None:
            if self._previous_checkpoint is not None and self._previous_checkpoint != checkpoint:
                shutil.rmtree(self._previous_checkpoint, ignore_errors=True)
            self._previous_checkpoint = checkpoint
        self._record_push(step, version, results,
                          str(checkpoint or "each engine's node (staged through Ray's object store)"))
        return version

    def dead_engines(self) -> list[str]:
        """The engines found dead (index, address, why): after a failed push, to tell a death from a refusal."""
        dead = []
        for engine in self.engines:
            alive, why = self._alive(engine)
            if not alive:
                dead.append(f"engine {engine.index} at {engine.info.url if engine.info else '?'} ({why})")
        return dead

    def after_failed_sync(self, step: int, error: str) -> bool:
        """A tensor or distributed push failed with ``error``. True: an engine died and rollout FT is on, so the
        push is retried (the next ``prepare_weight_sync`` restarts it and a new weight group is formed).
        An engine dead without rollout FT raises :class:`EngineDead`; anything else (a refusal) returns False:
        the run fails with ``error``, FT or not (sglang's weights are then partly updated). An engine dead of an
        out-of-memory raises :class:`RanOutOfMemory`, FT or not."""
        self._end_sessions_after_failure()
        self._raise_if_out_of_memory()
        dead = self.dead_engines()
        if not dead:
            return False
        if self.plan.recover_before_weight_sync:
            log.warning("step %d: weight push failed; %s died during it: restarting it and pushing again (%s)",
                        step, ", ".join(dead), error)
            return True
        raise EngineDead(
            f"step {step}: {', '.join(dead)} died during the weight push; rollout fault tolerance is off "
            f"(faultTolerance.enabled with rollout in components), so it is not restarted: {error}"
        )

    def _begin_session(self, url: str) -> None:
        if url in self._without_sessions:
            return
        if begin_weight_update(url, timeout_s=self.settings.push_timeout_s):
            self._sessions.add(url)
            return
        self._without_sessions.add(url)
        if SESSION_BEGIN not in self.unsupported_endpoints:  # the report says the push ran without a session
            self.unsupported_endpoints.append(SESSION_BEGIN)
        log.warning("engine %s answers 404 to /begin_weight_update (sglang before 0.5.21): its weights are updated "
                    "without a weight-update session", url)

    def _end_session(self, url: str) -> None:
        if url in self._sessions:
            self._sessions.discard(url)
            end_weight_update(url, timeout_s=self.settings.push_timeout_s)

    def _end_sessions_after_failure(self) -> None:
        """Close the sessions still open after a failed push on the engines still alive (a dead or restarted one
        lost its session with its process); a failure here is logged: the push's own error is the one raised."""
        alive = {e.info.url for e in self.engines if e.info is not None and self._alive(e)[0]}
        for url in list(self._sessions):
            if url not in alive:
                self._sessions.discard(url)
                continue
            try:
                self._end_session(url)
            except WeightSyncError as exc:
                log.warning("after a failed weight push: %s", exc)

    def finish_weight_sync(self, step: int, version: str) -> str:
        """After a tensor or distributed push: every engine closes its weight-update session and must report
        ``version``; caches flushed."""
        with self._watching():
            self._each(self._end_session)
            results = self._each(lambda url: confirm_weights(url, version, timeout_s=self.settings.push_timeout_s))
        self._record_push(step, version, results, f"{self.weight_sync.path} ({self.weight_sync.reason})")
        return version

    def _record_push(self, step: int, version: str, results, source: str) -> None:
        """Bookkeeping after every engine took ``version``: endpoints missing, memory, faults, monitors."""
        for result in results:
            for path in result.unsupported:
                if path not in self.unsupported_endpoints:
                    self.unsupported_endpoints.append(path)
                    log.warning("engine %s answers 404 to %s: that check is skipped for this run (reported)",
                                result.url, path)
        self.weight_versions.append(version)
        log.info("step %d: weight version %s pushed to %d engine(s) from %s", step, version, len(self.engines),
                 source)
        self._sample_memory()
        if self.injector is not None:
            for fault in self.injector.due(step):
                log.warning("fault injection: %s", fault)
                import ray

                ray.get(self.engines[fault.engine].actor.kill.remote())
        if self.monitor is not None:
            self.monitor.resume()

    def before_eval(self, eval_id: int) -> None:
        """Eval ``eval_id`` starts: the eval fleet probes itself when no monitor runs; monitors resume. An engine
        that failed the probe because it ran out of memory raises :class:`RanOutOfMemory`."""
        with self._watching():
            self.eval_fleet.before_use(eval_id)
        if self.monitor is not None:
            self.monitor.resume()

    def _each(self, action) -> list:
        urls = self.urls
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(urls)))) as pool:
            return list(pool.map(action, urls))

    def _alive(self, engine: _Engine) -> tuple[bool, str]:
        return engine_alive(engine.actor, self._engine_at(engine))

    def _require_all_alive(self, step: int) -> None:
        for engine in self.engines:
            alive, why = self._alive(engine)
            if not alive:
                raise EngineDead(
                    f"step {step}: engine {engine.index} at {engine.info.url} is dead ({why}); rollout fault "
                    "tolerance is off (faultTolerance.enabled with rollout in components), so it is not "
                    "restarted and the weight sync cannot reach it"
                )

    def _recover_dead_engines(self) -> None:
        for engine in self.engines:
            alive, why = self._alive(engine)
            if alive and not engine.stopped_by_monitor:
                continue
            old_url = engine.info.url if engine.info else None
            record = self._out_of_memory(engine)
            if record is not None:  # it will not fit the next time either: the run's answer is out-of-memory
                raise RanOutOfMemory(record)
            if "actor died" in why:
                engine.actor = self._new_actor(engine.index)
            log.warning("recovering engine %d (%s) before the weight sync", engine.index, why)
            engine.info = gather(
                [engine.actor.start.remote(self.settings.startup_timeout_s, self.serving_rollout)], [engine.index],
                ENGINE_START, self.serving_rollout)[0]
            self.generation += 1
            engine.restarts += 1
            engine.stopped_by_monitor = False
            if self.router is not None and old_url:
                self.router.replace_worker(old_url, engine.info.url)

    # ------------------------------------------------------------------ out of memory

    def _engine_at(self, engine: _Engine, phase: str = ENGINE_SERVING) -> EngineAt:
        info = engine.info
        args = {key.removeprefix("--"): value for key, value in self.settings.engine_args.items()}
        fraction = args.get("mem-fraction-static")
        return EngineAt(engine=engine.index, phase=phase, rollout=self.serving_rollout,
                        pid=info.pid if info else None, node=info.node_ip if info else None,
                        mem_fraction_static=None if fraction is None else str(fraction))

    def _out_of_memory(self, engine: _Engine) -> OutOfMemory | None:
        """Why ``engine`` is dead, when it ran out of memory while serving (:func:`.deaths.out_of_memory`)."""
        return out_of_memory(engine.actor, self._engine_at(engine))

    def _raise_if_out_of_memory(self) -> None:
        """:class:`RanOutOfMemory` for the first engine found dead of an out-of-memory."""
        for engine in self.engines:
            record = self._out_of_memory(engine)
            if record is not None:
                log.error("%s", record.line())
                raise RanOutOfMemory(record)

    @contextmanager
    def _watching(self) -> Iterator[None]:
        """Around calls to the engines: an error that came with an engine dead of an out-of-memory (a dropped
        connection, a failed push, an engine found dead) is raised as that out-of-memory."""
        try:
            yield
        except RanOutOfMemory:
            raise
        except Exception:
            self._raise_if_out_of_memory()
            raise

    def _refused_for_memory(self, url: str, call, *args, **kwargs):
        """``call(*args, **kwargs)``, a weight update to the engine at ``url`` (:func:`.deaths.refused_for_memory`)."""
        engine = next((e for e in self.engines if e.info is not None and e.info.url == url), None)
        return refused_for_memory(None if engine is None else self._engine_at(engine), call, *args, **kwargs)

    def _sample_memory(self) -> None:
        if not self.settings.use_gpus:
            return
        import ray

        try:
            readings = ray.get([e.actor.gpu_memory_gib.remote() for e in self.engines])
            if any(r is None for r in readings):
                log.warning("GPU memory of some engines could not be read (nvidia-smi): %s", readings)
            if all(r is None for r in readings):
                return
            held = sum(r for r in readings if r is not None)
        except Exception as exc:  # noqa: BLE001 - a measurement, not a reason to fail the run
            log.warning("could not read the engines' GPU memory: %s", exc)
            return
        self.memory_held_gib = max(self.memory_held_gib or 0.0, held)

    def report(self) -> dict:
        """The engines' part of the run report."""
        counters = self.monitor.counters if self.monitor else None
        return {
            "engines": len(self.engines),
            "urls": self.urls,
            "router": self.router_plan.reason,
            "restarts": sum(e.restarts for e in self.engines),
            "restarts_by_engine": [e.restarts for e in self.engines],
            "weight_versions": list(self.weight_versions),
            "weight_sync": self.weight_sync.path,
            "unsupported_endpoints": list(self.unsupported_endpoints),
            "health_monitors": 1 if self.monitor else 0,
            "health_probes": counters.probes if counters else 0,
            "health_failures": counters.failures if counters else 0,
            "faults_injected": [f"{f.kind}:step={f.step},engine={f.engine}" for f in self.injector.injected]
            if self.injector else [],
            "faults_ignored": self.faults_ignored or None,
            "eval_self_probes": self.eval_fleet.self_probes,
            "memory_held_gib": self.memory_held_gib,
        }

    def shutdown(self) -> None:
        """Stop the monitor, the router and every engine process; kill the actors. Safe to call twice."""
        import ray

        if self.monitor is not None:
            self.monitor.stop()
        if self.router is not None:
            self.router.stop()
        stops = []
        for engine in self.engines:
            try:
                stops.append(engine.actor.stop.remote())
            except Exception as exc:  # noqa: BLE001
                log.warning("engine %d: stop failed: %s", engine.index, exc)
        for ref in stops:
            try:
                ray.get(ref, timeout=60)
            except Exception as exc:  # noqa: BLE001 - a dead actor took its engine (PDEATHSIG) with it
                log.warning("engine stop: %s", exc)
        for engine in self.engines:
            try:
                ray.kill(engine.actor)
            except Exception:  # noqa: BLE001
                pass
