"""The rollout manager: the Ray actor that serves each rollout's training data to the driver.

It is constructed from the spec and its rollout-side plan (:func:`plan_replay`) alone. In debug mode it builds the
replay source and nothing else: no engine, no router, no rollout function, and it never reads the
(absent) rollout section. Everything it constructs is appended to ``construction_log`` so tests can
prove that (miles' replay fix).

Hook points for forge mode (engines, router, health monitors, weight sync, eval fleet):
``_start_rollout_side`` (called only when ``plan.start_engines``), ``after_train_step``,
``before_eval`` and ``shutdown``.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

from forge_replay.runtime.gating import RolloutSidePlan, plan_replay
from forge_replay.runtime.report import EvalRecord
from forge_replay.runtime.trainer.batching import BatchError, build_micro_batch, plan_step

log = logging.getLogger(__name__)


class RolloutDataError(ValueError):
    """A replayed rollout cannot be trained on: names the rollout, the dump file, the sample and field."""


@dataclass
class RolloutBatch:
    """One rollout, converted, split across ranks and packed; ``rank_batches[r]`` is rank r's
    list of micro-batches (an ObjectRef when served by the actor)."""

    rollout_id: int
    path: str
    fallback_used: bool
    num_samples: int
    tokens: int
    loss_tokens: float
    reward_mean: float
    truncated: int
    load_seconds: float
    rank_batches: list = field(repr=False)
    masked_out: int = 0
    """Samples whose loss mask is all zeros (slime accepts them; they add no loss token)."""
    rollout_id_mismatch: str = ""
    """A note when the dump's own rollout_id is not the rollout its file stands for (slime never reads it)."""
    multimodal_ignored: int = 0
    """Samples with multimodal inputs (VLM images, pixel_values): the builtin trainer trains their tokens only."""
    stretch: dict | None = None
    """spec.replay.stretch: what stretching this rollout did (:class:`~forge_replay.dumps.stretch.StretchRecord`)."""


def forge_prerequisite_problem(engine_command: str | None) -> str | None:
    """Why forge mode cannot start engines here (no sglang and no --engine-command), or None."""
    from forge_replay.runtime.engines.process import EngineUnavailable, resolve_engine_command

    try:
        resolve_engine_command(engine_command)
    except EngineUnavailable as exc:
        return str(exc)
    return None


class RolloutManager:
    """Serves replayed rollouts; in forge mode also owns the engine side (see module doc)."""

    def __init__(
        self,
        job,
        dumps_root: str,
        *,
        world_size: int,
        vocab_size: int | None = None,
        max_positions: int | None = None,
        engine_command: str | None = None,
        model_root: str | None = None,
        results_dir: str | None = None,
        use_object_store: bool = True,
        trainer_placement=None,
        plan: RolloutSidePlan | None = None,
    ):
        """``plan``: the run's rollout-side plan (the driver's); planned from the job when not given."""
        from forge_replay.replay import ReplaySource

        spec = job.spec
        self.job = job
        self.world_size = world_size
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.micro_batch_tokens = spec.trainer.micro_batch_tokens
        self.engine_command = engine_command
        self.model_root = model_root
        self.results_dir = results_dir
        self.use_object_store = use_object_store
        self.trainer_placement = trainer_placement
        self.plan: RolloutSidePlan = plan if plan is not None else plan_replay(spec).rollout_side
        self.construction_log: list[str] = []
        self.source = ReplaySource(dumps_root, spec.replay.dumps.path, spec.replay.dumps.fallback_to_first)
        self.construction_log.append("replay_source")
        self.engine_side = None

    def start(self) -> list[str]:
        """Start the rollout side the plan asks for (forge mode: engines, router, monitors; debug: nothing).

        A method of its own, not part of ``__init__``: an engine that cannot start then fails this call
        with its own error, where Ray would report a failed constructor only as a dead actor."""
        if self.plan.start_engines and self.engine_side is None:
            self._start_rollout_side()
        return list(self.construction_log)

    def serve_job(self, job, new_trainer: bool) -> None:
        """A sweep's next point: serve ``job`` (that point's spec: micro-batch size, stretched length) from now on;
        ``new_trainer``: the trainer's ranks were replaced, so the engines' weight-sync group is formed anew. The
        engines themselves stay as they are (the sweep starts new ones for another engine configuration)."""
        self.job = job
        self.micro_batch_tokens = job.spec.trainer.micro_batch_tokens
        if new_trainer and self.engine_side is not None:
            self.engine_side.trainer_replaced()

    # -- forge mode hook ---------------------------------------------------------------------
    def _start_rollout_side(self) -> None:
        """Start engines, router, monitors per ``self.plan`` (forge mode only; issue 5 fills this in).

        Fails fast, before anything is started, when no engine server can be launched.
        """
        problem = forge_prerequisite_problem(self.engine_command)
        if problem:
            raise RuntimeError(problem)
        import os
        import tempfile

        from forge_replay.runtime.engines.fleet import EngineFleet

        work_dir = (os.path.join(self.results_dir, "engines") if self.results_dir
                    else tempfile.mkdtemp(prefix="forge-replay-engines-"))
        fleet = EngineFleet.from_job(self.job, engine_command=self.engine_command, model_root=self.model_root,
                                     work_dir=work_dir, plan=self.plan, trainer_placement=self.trainer_placement)
        self.engine_side = fleet
        self.construction_log.append("engines")
        try:
            fleet.start()
        except BaseException:
            fleet.shutdown()  # no engine may outlive a failed start
            raise
        if fleet.router is not None:
            self.construction_log.append("router")
        if fleet.monitor is not None:
            self.construction_log.append("health_monitor")
        if fleet.injector is not None:
            self.construction_log.append("fault_injector")

    # -- queries used by tests and the driver ---------------------------------------------------
    def get_plan(self) -> RolloutSidePlan:
        return self.plan

    def get_construction_log(self) -> list[str]:
        return list(self.construction_log)

    def fallback_count(self) -> int:
        return self.source.fallback_count

    # -- data -----------------------------------------------------------------------------------
    def get_rollout(self, rollout_id: int) -> RolloutBatch:
        """Load rollout ``rollout_id`` (fallback counted), convert it, split and pack it."""
        from forge_replay.dumps import SampleError
        from forge_replay.dumps.convert import Conversion, ModelLimits, rollout_id_note

        started = time.perf_counter()
        if self.engine_side is not None:
            self.engine_side.before_generate(rollout_id)
        replayed = self.source.load_train(rollout_id)
        try:  # the conversion `replay.verify` ran on this dump before any GPU was requested
            data = Conversion.for_job(self.job.spec, ModelLimits(self.vocab_size, self.max_positions))(replayed.samples)
            lengths = [len(t) for t in data.tokens]
            rank_batches = [
                [build_micro_batch(data, indices, self.vocab_size) for indices in micro_batches]
                for micro_batches in plan_step(lengths, self.world_size, self.micro_batch_tokens)
            ]
        except (SampleError, BatchError) as exc:
            raise RolloutDataError(f"rollout {rollout_id}, dump {replayed.path}: {exc}") from None
        if self.use_object_store:
            import ray

            rank_batches = [ray.put(batches) for batches in rank_batches]
        return RolloutBatch(
            rollout_id=rollout_id,
            path=str(replayed.path),
            fallback_used=bool(replayed.fallback_used),
            num_samples=len(data.tokens),
            tokens=sum(lengths),
            loss_tokens=float(sum(sum(m) for m in data.loss_masks)),
            reward_mean=statistics.fmean(data.rewards) if data.rewards else 0.0,
            truncated=sum(bool(t) for t in data.truncated),
            load_seconds=time.perf_counter() - started,
            rank_batches=rank_batches,
            masked_out=data.masked_out,
            multimodal_ignored=data.multimodal_ignored,
            stretch=None if data.stretch is None else data.stretch.to_dict(),
            rollout_id_mismatch=rollout_id_note(replayed.dump_rollout_id, replayed.file_rollout_id)
            if replayed.dump_rollout_id is not None else "",
        )

    def evaluate(self, eval_id: int, before_train: bool = False) -> EvalRecord:
        """Eval ``eval_id`` from its ``eval_N`` dump (no fallback: missing is an empty result), after training
        rollout ``eval_id`` or, ``before_train``, before the first step.

        Engines that fail the eval fleet's self-probe skip this eval, recorded with the reason: the job goes on,
        as miles records a skipped eval point instead of failing the run."""
        from forge_replay.runtime.engines.eval_fleet import EvalFleetUnhealthy

        after = None if before_train else eval_id  # slime: eval N runs after training rollout N
        try:
            self.before_eval(eval_id)
        except EvalFleetUnhealthy as exc:
            log.warning("eval %d skipped: %s", eval_id, exc)
            return EvalRecord(after_rollout_id=after, eval_id=eval_id, path=self.source.eval_file(eval_id),
                              missing=False, num_samples=0, reward_mean=None, truncated=0, skipped=str(exc))
        result = self.source.load_eval(eval_id)
        replay = self.job.spec.replay
        rewards = result.rewards(replay.eval_reward_key or replay.reward_key)
        return EvalRecord(
            after_rollout_id=after,
            eval_id=eval_id,
            path=None if result.path is None else str(result.path),
            missing=bool(result.missing),
            num_samples=len(rewards),
            reward_mean=statistics.fmean(rewards) if rewards else None,
            truncated=sum(bool(t) for t in result.truncated),
        )

    # -- lifecycle hooks (no-ops in debug mode) ------------------------------------------------------
    def after_train_step(self, step: int, weights: object) -> None:
        """The disk path's weight sync after every training step: forge mode pushes ``weights`` (``[ObjectRef]``
        to the trainer's checkpoint files) to the engines. Debug mode has no engines: nothing happens."""
        if self.engine_side is None:
            return
        self.engine_side.after_train_step(step, weights)

    # The tensor and distributed paths: the driver runs the transfer between these (see weights.sync).
    def prepare_weight_sync(self, step: int):
        """Engines ready for a push (recovered or refused, memory resumed): the version and generation."""
        return self._engines().prepare_weight_sync(step)

    def init_weight_group(self, group) -> None:
        """Every engine joins the weight-sync group (trainer rank 0 joins at the same time)."""
        self._engines().init_weight_group(group)

    def update_weights_from_distributed(self, buckets, version: str) -> int:
        """Announce each bucket to every engine while trainer rank 0 broadcasts it."""
        return self._engines().update_weights_from_distributed(buckets, version)

    def after_failed_sync(self, step: int, error: str) -> bool:
        """A push failed: True to retry it (an engine died, rollout FT restarts it); raises when one died without FT."""
        return self._engines().after_failed_sync(step, error)

    def finish_weight_sync(self, step: int, version: str) -> str:
        """Every engine reports ``version``; caches flushed; the step's bookkeeping."""
        return self._engines().finish_weight_sync(step, version)

    def _engines(self):
        if self.engine_side is None:
            raise RuntimeError("no engines in this run (debug mode): there is no weight sync")
        return self.engine_side

    def before_train_step(self, step: int) -> None:
        """Called before a training step when engines are colocated: they release their GPU memory."""
        if self.engine_side is None:
            return
        self.engine_side.before_train_step(step)

    def engine_report(self) -> dict | None:
        """The engines' part of the run report (count, restarts, weight versions, memory held); None in debug."""
        return None if self.engine_side is None else self.engine_side.report()

    def before_eval(self, eval_id: int) -> None:
        """Called before each eval: forge mode lets the eval fleet probe itself when no monitor runs."""
        if self.engine_side is None:
            return
        self.engine_side.before_eval(eval_id)

    def shutdown(self) -> None:
        """Stop everything this manager started (engines, router, monitors)."""
        if self.engine_side is not None:
            self.engine_side.shutdown()
        self.engine_side = None
