"""The driver's shell of a weight sync after every training step (forge mode): runs the trainer's side and
the fleet's side of a push at once, fails fast on the first error, retries a push an engine died in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from forge_replay.errors import Portable
from forge_replay.runtime.weights.calls import WeightSyncError
from forge_replay.runtime.weights.distributed import ParamMeta, bucket_bytes_from_env, plan_buckets, plan_weight_group
from forge_replay.runtime.weights.tensor import EngineGPUs, plan_feeds

log = logging.getLogger(__name__)


MAX_PUSH_ATTEMPTS = 3
"""A push an engine died in is retried (rollout FT restarts it) at most this many times per step in all."""
ABORT_GRACE_S = 10.0
"""After one side of a push failed, how long the other may take to fail too before it counts as stuck."""


@dataclass(frozen=True)
class SyncTarget:
    """What the fleet's ``prepare_weight_sync`` hands the driver: the version to push and the engines' shape."""

    version: str
    generation: int
    """Bumped whenever an engine was (re)started: a new weight group is formed before the push."""
    tp_sizes: tuple[int, ...]
    engines: tuple[EngineGPUs, ...] = ()
    """The tensor path: where each colocated engine runs (address, node, base GPU, TP size); empty otherwise."""


class EngineWeightSync:
    """The driver's side of a weight sync after every training step (forge mode).

    ``disk``: the trainer's checkpoint goes through Ray's object store to each engine's node (the fleet
    does the rest). ``distributed``: the fleet prepares (recovery, memory), the trainer broadcasts while
    the fleet posts the bucket requests, the fleet checks the versions. ``tensor``: the same, but the
    trainer ranks post CUDA IPC handles to the colocated engines themselves (the tensors must stay alive
    until the engine has answered, and the posting rank shares the engine's node)."""

    def __init__(self, plan, manager, group, config, *, bucket_bytes: int | None = None,
                 timeout_s: float = 600.0):
        self.plan = plan
        self.manager = manager
        self.group = group
        self.config = config
        self.bucket_bytes = bucket_bytes or bucket_bytes_from_env()
        self.timeout_s = timeout_s
        self._trainer_refs: list = []
        self._generation: int | None = None
        self._buckets: list[list[ParamMeta]] | None = None
        self._rank_gpus: list | None = None

    def after_step(self, step: int) -> None:
        """Push the weights of step ``step`` to every engine and check they took.

        A failed push (the transfer, or the version check after it) is retried when an engine died in it and
        rollout FT is on (the engine is restarted and a new weight group formed); otherwise the run fails with
        the error, naming the engine. A side still inside a collective :data:`ABORT_GRACE_S` after the other side failed can never
        leave it: the trainer ranks are then stopped, so the run ends now instead of after the group timeout."""
        import ray

        if self.plan.path == "disk":
            self._disk(step)
            return
        for attempt in range(1, MAX_PUSH_ATTEMPTS + 1):
            target: SyncTarget = ray.get(self.manager.prepare_weight_sync.remote(step))
            try:
                if self.plan.path == "distributed":
                    self._distributed(target)
                elif self.plan.path == "tensor":
                    self._tensor(target)
                else:
                    raise NotImplementedError(f"weight sync path {self.plan.path!r} is not wired into the driver")
            except PushFailed as exc:
                self._generation = None  # whatever group there was is broken: form a new one
                if exc.stuck:
                    raise WeightSyncError(f"{exc}; {self._stop_stuck(exc.stuck)}") from None
                if self._retry(step, attempt, str(exc)):
                    continue
                raise WeightSyncError(str(exc)) from None
            try:  # an engine that died after taking the weights, before confirming them, gets them again
                ray.get(self.manager.finish_weight_sync.remote(step, target.version))
                return
            except ray.exceptions.RayTaskError as exc:
                if self._retry(step, attempt, _cause(exc)):
                    continue
                raise

    def _disk(self, step: int) -> None:
        """The disk path: the fleet pushes the checkpoint; one an engine died in is pushed again (rollout FT)."""
        import ray

        checkpoint = self._checkpoint_ref(step)
        for attempt in range(1, MAX_PUSH_ATTEMPTS + 1):
            try:
                ray.get(self.manager.after_train_step.remote(step, checkpoint))
                return
            except ray.exceptions.RayTaskError as exc:
                if self._retry(step, attempt, _cause(exc)):
                    continue
                raise

    def _retry(self, step: int, attempt: int, problem: str) -> bool:
        """Whether a failed push is tried again: attempts are left and the fleet restarted an engine that died
        in it (rollout FT); it raises when one died without rollout FT."""
        import ray

        return attempt < MAX_PUSH_ATTEMPTS and ray.get(self.manager.after_failed_sync.remote(step, problem))

    def _bucket_plan(self) -> list[list[ParamMeta]]:
        """The trainer's parameters in buckets, read from rank 0 once per run (the same for every step)."""
        if self._buckets is None:
            self._buckets = plan_buckets(self.group.weight_metadata(), self.bucket_bytes)
        return self._buckets

    def _stop_stuck(self, stuck: list) -> str:
        """Stop the trainer ranks when one is still in a weight-sync collective (nothing else gets it out)."""
        import ray

        trainer_refs = {ref.hex() for ref in self._trainer_refs}
        if not any(ref.hex() in trainer_refs for ref in stuck):
            return (f"the engines were still inside the weight-sync group {ABORT_GRACE_S:.0f} s later (they leave "
                    "it at their own group timeout)")
        for rank in self.group.ranks:
            ray.kill(rank)
        return (f"trainer rank 0 was still inside the weight-sync group {ABORT_GRACE_S:.0f} s later, where it "
                "would wait for the group timeout: the trainer ranks were stopped")

    def _checkpoint_ref(self, step: int) -> list:
        """The disk path: rank 0 writes a Hugging Face checkpoint to its local disk and hands its files to
        Ray's object store; each engine's node stages them locally (no shared volume needed). The reference
        is wrapped in a list so the rollout manager passes it on without fetching the bytes itself."""
        import os
        import tempfile

        name = self.config.job.metadata.name
        directory = os.path.join(tempfile.gettempdir(), f"forge-replay-{name}-weights", f"step_{step}")
        return [self.group.checkpoint_files_ref(directory)]

    def _distributed(self, target: SyncTarget) -> None:
        buckets = self._bucket_plan()
        if target.generation != self._generation:
            address, port = self.group.weight_group_address()
            group = plan_weight_group(address, port, target.tp_sizes, self.plan.backend, target.generation)
            log.info("weight sync: forming %s over %s (trainer rank 0 + %d engine rank(s))", group.group_name,
                     group.backend, group.world_size - 1)
            self._trainer_refs = self.group.join_weight_group_async(group, self.timeout_s)
            wait_all([self.manager.init_weight_group.remote(group), *self._trainer_refs],
                     what=f"forming the weight-sync group {group.group_name}")
            self._generation = target.generation
        self._trainer_refs = self.group.broadcast_weights_async(buckets)
        wait_all([self.manager.update_weights_from_distributed.remote(buckets, target.version),
                  *self._trainer_refs], what=f"broadcasting weight version {target.version}")

    def _tensor(self, target: SyncTarget) -> None:
        """Every trainer rank hands its GPU's copy of each bucket to the colocated engine TP rank on that GPU;
        the engine's first trainer rank posts it (see ``TrainerRank.update_weights_from_tensor``)."""
        if self._rank_gpus is None:
            self._rank_gpus = self.group.gpu_locations()
        feeds = plan_feeds(target.engines, self._rank_gpus)
        self._trainer_refs = self.group.update_weights_from_tensor_async(self._bucket_plan(), feeds, target.version,
                                                                         self.timeout_s)
        sent = wait_all(self._trainer_refs, what=f"handing weight version {target.version} to the engines as tensors")
        feeding = [s for s in sent if s["tensors"]]
        log.info("weight sync: version %s as tensors: %d request(s) to %d engine(s), %d tensor(s) from each of "
                 "%d trainer rank(s)", target.version, sum(s["posts"] for s in sent), len(feeds),
                 feeding[0]["tensors"] if feeding else 0, len(feeding))


class PushFailed(Portable, WeightSyncError):
    """One side of a push failed; ``stuck``: the refs of the other side still running :data:`ABORT_GRACE_S` later."""

    def __init__(self, message: str, stuck: list):
        super().__init__(message)
        self.stuck = stuck


def wait_all(refs: list, *, what: str, grace_s: float | None = None) -> list:
    """ray.get over refs that depend on each other (HTTP on one side, a collective on the other), raising
    :class:`PushFailed` as soon as one fails: with the other errors that came within ``grace_s`` (a failed
    member breaks the collective, so the rest usually fail at once) and the refs still running after it."""
    import ray

    grace_s = ABORT_GRACE_S if grace_s is None else grace_s
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except ray.exceptions.RayError as exc:
            errors = [_cause(exc)]
            if pending:
                finished, pending = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
                for ref in finished:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayError as other:
                        errors.append(_cause(other))
            oom = _out_of_memory(exc)
            if oom is not None:  # a trainer rank ran out of memory in the push: the run's answer, not a failed push
                raise oom from None
            raise PushFailed(f"{what}: " + "; ".join(dict.fromkeys(errors)), stuck=pending) from None
    return ray.get(refs)


def _out_of_memory(exc):
    """The :class:`~forge_replay.api.outcome.RanOutOfMemory` a rank raised, inside Ray's wrapper, or None."""
    from forge_replay.api.outcome import RanOutOfMemory

    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, RanOutOfMemory) else None


def _cause(exc) -> str:
    cause = getattr(exc, "cause", None) or exc
    return str(cause).strip()
