"""The reconcile function: observe a ForgeReplayJob's children, create what is missing, write status.

Level-based and idempotent: every trigger (the job changed, a child changed, the operator restarted)
runs the same function, which gets-or-creates children by name, so a restart mid-reconcile never
duplicates anything. The decisions themselves are pure (``render``, ``status_from``,
``changed_fields``); this module only does the I/O around them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import yaml
from pydantic import ValidationError

from forge_replay.api import API_VERSION, KIND, ForgeReplayJob, ForgeReplayJobStatus, SpecInvalid, parse_job
from forge_replay.api.images import IMAGES_KEY
from forge_replay.api.paths import CONFIG_FILE
from forge_replay.api.progress_report import PROGRESS_KEY, ProgressReport
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.controller import metrics, naming, out_of_memory, stuck
from forge_replay.controller.claims import claim_problems, named_claims
from forge_replay.controller.images import ray_pod_images
from forge_replay.controller.kube import Kube, KubeError
from forge_replay.controller.render import frozen_spec, render, spec_hash
from forge_replay.controller.settings import OperatorSettings
from forge_replay.controller.status import (
    PERMANENT_API_ERRORS,
    Refusal,
    invalid_spec_message,
    new_warning,
    phase_changed,
    rfc3339,
    same_status,
    status_for_api_error,
    status_for_baseline,
    status_for_claims,
    status_for_invalid_spec,
    status_from,
    verify_state,
)
from forge_replay.controller.stuck import verify_pod_note
from forge_replay.dumps.model_limits import inline_position_problems

log = logging.getLogger("forge_replay.controller")

EVENT_SOURCE = "forge-replay-operator"


class ReconcileConflict(RuntimeError):
    """The world is in a state the operator must not act on yet (retried later)."""


class _StaleJob(Exception):
    """A reconcile working from the held copy of a job is about to act on its spec: read it fresh first."""


WATCHED_TRIGGERS = ("rayjob", "verify", "progress", "resync")
"""Reconciles that work from the job as the watch (or our own last patch) delivered it instead of reading it."""


def _resource_version(body: dict[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or -1)
    except ValueError:  # not etcd's revision: never preferred over what is held
        return -1


@dataclass(frozen=True)
class Launched:
    """What was launched for a job: the spec frozen in its config ConfigMap."""

    job: ForgeReplayJob
    spec_hash: str


def changed_fields(before: Any, after: Any, path: str = "spec") -> list[str]:
    """Dotted paths (camelCase) where two normalized specs differ."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after)):
            out += changed_fields(before.get(key), after.get(key), f"{path}.{key}")
        return out
    return [] if before == after else [path]


def refusal_for_change(launched: ForgeReplayJob, current: ForgeReplayJob) -> Refusal | None:
    """A Refusal when ``current`` changes anything but ``suspend`` relative to the launched spec."""
    fields = changed_fields(frozen_spec(launched), frozen_spec(current))
    if not fields:
        return None
    shown = ", ".join(fields[:8]) + (f" and {len(fields) - 8} more" if len(fields) > 8 else "")
    return Refusal(
        "SpecChangeRefused",
        f"spec changed after launch ({shown}); only spec.suspend and metadata may change once the job's "
        "objects exist, so the job keeps running the launched spec. Revert the change, or delete and "
        "re-create the ForgeReplayJob to run the new spec.",
    )


class Reconciler:
    """Runs reconciles against one API server; safe to call from several threads."""

    def __init__(self, kube: Kube, settings: OperatorSettings, phases: metrics.PhaseBook | None = None):
        self.kube = kube
        self.settings = settings
        self.phases = phases or metrics.PhaseBook()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._jobs: dict[tuple[str, str], dict[str, Any]] = {}  # the newest body seen of each job

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """The job is gone: drop its lock and its phase from the gauge."""
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
            self._jobs.pop((namespace, name), None)
        self.phases.set(namespace, name, None)
        metrics.JOBS_BOOK.set(namespace, name, None)

    def observe_job(self, body: dict[str, Any]) -> None:
        """A ForgeReplayJob as a watch event, a list or our own status patch returned it; kept when it is at least
        as new as the one held (so a late watch event never hides a status just written)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        with self._locks_guard:
            held = self._jobs.get(key)
            if held is None or _resource_version(body) >= _resource_version(held):
                self._jobs[key] = body

    def _held_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._locks_guard:
            return self._jobs.get((namespace, name))

    def list_jobs(self, namespaces: tuple[str, ...] = ()) -> list[tuple[str, str, str | None]]:
        """(namespace, name, phase) of every ForgeReplayJob in ``namespaces`` (all when empty); a job gone without
        its delete event reaching us (a watch gap) is forgotten here."""
        out = []
        for namespace in namespaces or (None,):
            for item in self.kube.list_all(API_VERSION, KIND, namespace):
                self.observe_job(item)
                meta = item["metadata"]
                out.append((meta["namespace"], meta["name"], (item.get("status") or {}).get("phase")))
        for namespace, name in metrics.JOBS_BOOK.known(namespaces) - {(ns, n) for ns, n, _ in out}:
            self.forget(namespace, name)
        return out

    # ---------------------------------------------------------------------------------- reconcile

    def reconcile(
        self, namespace: str, name: str, trigger: str, rayjob: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Bring job ``namespace/name`` one step closer to done; returns the status written (or kept).

        ``rayjob`` is the RayJob as a watch event just delivered it (saves reading it again). Reconciles after a
        child's event or in the resync work from the job as last seen (WATCHED_TRIGGERS); one that would act on
        its spec (create the RayJob, change its suspend) reads the job first."""
        metrics.RECONCILES.labels(trigger=trigger).inc()
        try:
            with self._lock(namespace, name):
                if trigger in WATCHED_TRIGGERS:
                    held = self._held_job(namespace, name)
                    if held is not None:
                        try:
                            return self._reconcile(namespace, name, rayjob, held)
                        except _StaleJob:
                            pass
                return self._reconcile(namespace, name, rayjob, None)
        except Exception as exc:
            metrics.ERRORS.labels(error=type(exc).__name__).inc()
            if isinstance(exc, KubeError) and exc.status in PERMANENT_API_ERRORS:
                self._report_stalled(namespace, name, exc)
            elif isinstance(exc, (ReconcileConflict, KubeError)):
                self._report_error(namespace, name, exc)
            raise

    def _report_stalled(self, namespace: str, name: str, exc: KubeError) -> None:
        """A permanent API error: Stalled=True with the API's message and a Warning event (best effort)."""
        try:
            body = self.kube.get(API_VERSION, KIND, namespace, name)
            if body is None:
                return
            previous = body.get("status") or {}
            status = status_for_api_error(body["metadata"].get("generation"), exc.status, str(exc), previous)
            self._write_status(body, previous, status)
        except Exception as patch_error:  # the original error is what gets raised and logged
            log.warning("could not report the API error on %s/%s: %s", namespace, name, patch_error)

    def _report_error(self, namespace: str, name: str, exc: Exception) -> None:
        """Put a failing reconcile's reason into status.message (best effort; it is retried)."""
        message = f"reconcile failed, retrying: {exc}"[:2000]
        try:
            self.observe_job(self.kube.merge_patch(API_VERSION, KIND, namespace, name, {"status": {"message": message}},
                                                   status=True))
        except Exception as patch_error:  # the original error is what gets raised and logged
            log.warning("could not report the reconcile error on %s/%s: %s", namespace, name, patch_error)

    def _reconcile(
        self, namespace: str, name: str, seen_rayjob: dict[str, Any] | None, held: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        body = held
        if body is None:
            body = self.kube.get(API_VERSION, KIND, namespace, name)
            if body is not None:
                self.observe_job(body)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        fresh = held is None
        previous = body.get("status") or {}
        meta = body["metadata"]
        rayjob = seen_rayjob
        if rayjob is None and previous.get("rayJobName"):
            rayjob = self.kube.get("ray.io/v1", naming.RAY_KIND, namespace, naming.ray_job_name(name))
        # Not launched yet (no rayJobName): the launch path get-or-creates the RayJob, so it is not read first.
        try:
            job = parse_job({k: v for k, v in body.items() if k != "status"})
            beyond_the_model = inline_position_problems(job.spec)  # what validate refuses too, before any GPU
            if beyond_the_model:
                raise SpecInvalid(beyond_the_model)
        except SpecInvalid as invalid:
            launched = self._launched(namespace, name, meta.get("uid"))
            if launched is None:
                status = status_for_invalid_spec(meta.get("generation"), invalid.problems, previous)
                return self._write_status(body, previous, status)
            # Invalid after launch (a CRD without its rules): keep running the launched spec.
            refusal = Refusal(
                "SpecInvalid",
                "spec invalid after launch; the job keeps running the launched spec: "
                + invalid_spec_message(invalid.problems),
            )
            effective = self._as_current(launched.job, body, suspend=launched.job.spec.suspend)
            return self._drive(body, effective, previous, refusal, rayjob, fresh)
        if rayjob is not None:
            self._check_owner(rayjob, job)
        refusal = None
        effective = job
        launched_hash = ((rayjob or {}).get("metadata", {}).get("annotations") or {}).get(naming.ANNOTATION_SPEC_HASH)
        # Steady state (the RayJob carries this spec's hash) needs no read of the launched spec.
        if launched_hash != spec_hash(job):
            launched = self._launched(namespace, name, meta.get("uid"))
            if launched is not None:
                refusal = refusal_for_change(launched.job, job)
                if refusal is not None:
                    effective = self._as_current(launched.job, body, suspend=job.spec.suspend)
        return self._drive(body, effective, previous, refusal, rayjob, fresh)

    def _drive(
        self,
        body: dict[str, Any],
        job: ForgeReplayJob,
        previous: dict[str, Any],
        refusal: Refusal | None,
        rayjob: dict[str, Any] | None,
        fresh: bool = True,
    ) -> dict[str, Any]:
        namespace, name = job.metadata.namespace, job.metadata.name
        assert namespace and name
        launched_before = bool(previous.get("rayJobName"))
        verify_job = None
        verify_message = None
        if rayjob is None and not launched_before and not stuck.ended(previous):
            if not fresh:
                raise _StaleJob  # everything before launch acts on the spec
            # Before launch: the claims it names, then every prerequisite, then verify, then the RayJob.
            if previous.get("phase") not in ("Verifying", "Launching"):  # checked until something is created
                problems = self._claim_problems(job)
                if problems:
                    return self._write_status(body, previous, status_for_claims(job, problems, previous))
            missing = self._baseline_problem(job) if previous.get("phase") not in ("Verifying", "Launching") else None
            if missing:  # spec.expect.baseline's ConfigMap: found missing before any GPU is requested
                return self._write_status(body, previous, status_for_baseline(job, missing, previous))
            objects = render(job, self.settings)
            wanted_rayjob = objects[-1]
            verify_obj = next((o for o in objects if o["kind"] == "Job"), None)
            for obj in objects:
                if obj["kind"] not in ("Job", naming.RAY_KIND):
                    self._get_or_create(obj, job)
            if verify_obj is not None:
                verify_job = self._get_or_create(verify_obj, job)
                verify_message = self._verify_output(namespace, verify_obj["metadata"]["name"], verify_job)
            if verify_obj is None or verify_state(verify_job).state == "succeeded":
                rayjob, created = self.kube.create(wanted_rayjob)
                if created:
                    self._observe_launch(job, body)
                else:
                    self._check_owner(rayjob, job)
        elif rayjob is not None:
            rayjob = self._propagate_suspend(job, rayjob, fresh)

        # After launch the progress ConfigMap also holds the runtime's own result (read when the RayJob is gone).
        progress_map = self._progress_map(namespace, name) if _may_have_progress(rayjob, launched_before) else None
        progress = self._progress(namespace, name, progress_map)
        self._record_images(job, rayjob, progress_map)
        status_job = job.model_copy(update={"status": _status_model(previous)})
        launch_pods = self._launch_pods(namespace, rayjob)
        status = status_from(
            status_job, rayjob, verify_job, progress, verify_message=verify_message, refusal=refusal,
            launch_note=verify_pod_note(launch_pods, failed=False) if launch_pods else None,
            ray_pods=self._ray_pods_at_failure(namespace, rayjob, previous), launch_pods=launch_pods,
            bounds=stuck.Bounds(self.settings.image_pull_seconds, self.settings.crash_loop_restarts),
        )
        self._tear_down_at_once(rayjob, stuck.teardown(status, rayjob))
        return self._write_status(body, previous, status)

    # ------------------------------------------------------------------------------------ pieces

    def _launched(self, namespace: str, name: str, uid: str | None) -> Launched | None:
        """The launched spec, read back from the job's config ConfigMap (None before launch)."""
        config = self.kube.get("v1", "ConfigMap", namespace, naming.config_map_name(name))
        if config is None:
            return None
        owners = [o.get("uid") for o in config["metadata"].get("ownerReferences") or []]
        if uid not in owners:
            raise ReconcileConflict(
                f"ConfigMap {namespace}/{naming.config_map_name(name)} is not owned by ForgeReplayJob "
                f"{name} (uid {uid}); it belongs to an earlier job of that name and will be garbage-collected, "
                "or someone else created it: delete it to let this job start"
            )
        text = (config.get("data") or {}).get(CONFIG_FILE, "")
        try:
            runtime = RuntimeConfig.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError, SpecInvalid) as exc:
            raise ReconcileConflict(
                f"ConfigMap {namespace}/{naming.config_map_name(name)} key {CONFIG_FILE} does not hold a "
                f"valid runtime config ({exc}); it was edited by hand: delete and re-create the job"
            ) from None
        annotations = config["metadata"].get("annotations") or {}
        return Launched(runtime.job, annotations.get(naming.ANNOTATION_SPEC_HASH) or spec_hash(runtime.job))

    @staticmethod
    def _as_current(launched: ForgeReplayJob, body: dict[str, Any], *, suspend: bool) -> ForgeReplayJob:
        """The launched spec with the live object's metadata (uid, generation) and the wanted suspend."""
        spec = launched.spec.model_copy(update={"suspend": suspend})
        current_meta = parse_meta(body)
        return launched.model_copy(update={"spec": spec, "metadata": current_meta})

    def _get_or_create(self, obj: dict[str, Any], job: ForgeReplayJob) -> dict[str, Any]:
        """Create ``obj``, or read it back when it exists (one request when new, two otherwise)."""
        existing, _ = self.kube.create(obj)
        self._check_owner(existing, job)
        return existing

    @staticmethod
    def _check_owner(obj: dict[str, Any], job: ForgeReplayJob) -> None:
        owners = [o.get("uid") for o in obj["metadata"].get("ownerReferences") or []]
        if job.metadata.uid not in owners:
            meta = obj["metadata"]
            raise ReconcileConflict(
                f"{obj['kind']} {meta.get('namespace')}/{meta['name']} exists but is not owned by ForgeReplayJob "
                f"{job.metadata.name} (uid {job.metadata.uid}); rename the job or delete that object"
            )

    def _verify_output(self, namespace: str, job_name: str, verify_job: dict[str, Any]) -> str | None:
        """What the verify pod printed once it failed, or why it is stuck while it runs (None when done)."""
        state = verify_state(verify_job).state
        if state == "succeeded":
            return None
        pods = self.kube.list("v1", "Pod", namespace, f"job-name={job_name}")
        return verify_pod_note(pods, failed=state == "failed")

    def _claim_problems(self, job: ForgeReplayJob) -> list:
        """What keeps the job's PVCs (dumps, model, results) from being mounted by all its pods."""
        namespace = job.metadata.namespace
        assert namespace
        read = [(c, self.kube.get("v1", "PersistentVolumeClaim", namespace, c.name)) for c in named_claims(job)]
        return claim_problems(namespace, read)

    def _baseline_problem(self, job: ForgeReplayJob) -> str | None:
        """Why the ConfigMap of spec.expect.baseline cannot give the runtime its baseline
        (``verdict.baseline.configmap_problem``), or None (also without one; a baseline on a PVC is read by the
        runtime)."""
        from forge_replay.verdict.baseline import configmap_problem

        baseline = job.spec.expect.baseline if job.spec.expect is not None else None
        if baseline is None or baseline.config_map_name is None:
            return None
        namespace, name = job.metadata.namespace, baseline.config_map_name
        return configmap_problem(self.kube.get("v1", "ConfigMap", namespace, name), namespace, name, job.spec)

    def _launch_pods(self, namespace: str, rayjob: dict[str, Any] | None) -> list[dict[str, Any]] | None:
        """The Ray pods of a launching RayJob: why they do not start, in their own words (``verify_pod_note``), and
        whether that ends the job (``stuck``). None when it is not launching."""
        status = (rayjob or {}).get("status") or {}
        cluster = status.get("rayClusterName")
        if not cluster or status.get("jobDeploymentStatus") not in ("", None, "New", "Initializing", "Retrying"):
            return None
        if ((rayjob or {}).get("spec") or {}).get("suspend") or (rayjob or {})["metadata"].get("deletionTimestamp"):
            return None  # suspended or deleted: its pods are being deleted, none is meant to start
        return self.kube.list("v1", "Pod", namespace, f"ray.io/cluster={cluster}")

    def _ray_pods_at_failure(
        self, namespace: str, rayjob: dict[str, Any] | None, previous: dict[str, Any]
    ) -> list[dict[str, Any]] | None:
        """The pods of a RayJob's Ray cluster, read once when the RayJob has just ended (whether its head pod was
        lost mid-run: ``head_pod.head_pod_loss``); None otherwise."""
        status = (rayjob or {}).get("status") or {}
        cluster = status.get("rayClusterName")
        if not cluster or not status.get("endTime") or previous.get("phase") in ("Succeeded", "Failed"):
            return None
        if status.get("jobDeploymentStatus") == "Complete" and status.get("jobStatus") == "SUCCEEDED":
            return None
        return self.kube.list("v1", "Pod", namespace, f"ray.io/cluster={cluster}")

    def _propagate_suspend(self, job: ForgeReplayJob, rayjob: dict[str, Any], fresh: bool = True) -> dict[str, Any]:
        """spec.suspend -> RayJob.spec.suspend. With a Kueue queue Kueue owns suspend (it un-suspends what it
        admits, and re-suspending would tear the Ray cluster down on every event): never touched."""
        wanted = job.spec.suspend
        current = bool((rayjob.get("spec") or {}).get("suspend"))
        if wanted == current or job.spec.scheduling.queue_name:
            return rayjob
        if not fresh:
            raise _StaleJob  # suspend may have changed since the held copy: act on the job as it is now
        meta = rayjob["metadata"]
        return self.kube.merge_patch(
            "ray.io/v1", naming.RAY_KIND, meta["namespace"], meta["name"], {"spec": {"suspend": wanted}}
        )

    def _tear_down_at_once(self, rayjob: dict[str, Any] | None, patch: dict[str, Any] | None) -> None:
        """A job that ran out of memory, or could not start, keeps no Ray cluster (``stuck.teardown``): KubeRay
        deletes it as soon as the Ray job has ended (ttlSecondsAfterFinished 0 instead of the spec's, which keeps a
        finished cluster for its logs), and ends a Ray job that never started (activeDeadlineSeconds 1)."""
        if rayjob is None or not patch:
            return
        meta = rayjob["metadata"]
        try:
            self.kube.merge_patch("ray.io/v1", naming.RAY_KIND, meta["namespace"], meta["name"], {"spec": patch})
        except KubeError as exc:
            if exc.status != 404:  # a RayJob already gone holds no cluster
                raise

    def _progress_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get("v1", "ConfigMap", namespace, naming.progress_map_name(name))

    def _record_images(self, job: ForgeReplayJob, rayjob: dict[str, Any] | None,
                       progress_map: dict[str, Any] | None) -> None:
        """Once the Ray job runs: the Ray pods' image digests (``images.ray_pod_images``) into the progress ConfigMap,
        where the runtime reads them for report.json's environment (it may not read pods itself). Once per job: not
        again when recorded, nor while a pod has not reported its image yet (a later reconcile records them)."""
        status = (rayjob or {}).get("status") or {}
        cluster = status.get("rayClusterName")
        if progress_map is None or not cluster or status.get("jobDeploymentStatus") != "Running":
            return
        if IMAGES_KEY in (progress_map.get("data") or {}):
            return
        pods = self.kube.list("v1", "Pod", progress_map["metadata"]["namespace"], f"ray.io/cluster={cluster}")
        images = ray_pod_images(pods, byo=job.spec.trainer.backend != "builtin")
        if images is None:
            return
        meta = progress_map["metadata"]
        self.kube.merge_patch("v1", "ConfigMap", meta["namespace"], meta["name"],
                              {"data": {IMAGES_KEY: json.dumps(images, sort_keys=True)}})

    def _progress(self, namespace: str, name: str, config: dict[str, Any] | None) -> ProgressReport | None:
        text = ((config or {}).get("data") or {}).get(PROGRESS_KEY)
        if not text:
            return None
        try:
            return ProgressReport.model_validate_json(text)
        except ValidationError as exc:
            log.warning(
                "ConfigMap %s/%s key %s is not a valid progress report, status keeps the last good one: %s",
                namespace, naming.progress_map_name(name), PROGRESS_KEY, exc,
            )  # fmt: skip
            return None

    def _observe_launch(self, job: ForgeReplayJob, body: dict[str, Any]) -> None:
        created = body["metadata"].get("creationTimestamp")
        if created:
            started = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
            metrics.TIME_TO_LAUNCH.observe(max(0.0, time.time() - started.timestamp()))

    def _write_status(
        self, body: dict[str, Any], previous: dict[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        self.phases.set(namespace, name, status.get("phase"))
        merged = {k: v for k, v in {**previous, **status}.items() if v is not None}  # as the merge patch leaves it
        metrics.JOBS_BOOK.set(namespace, name, merged, meta.get("creationTimestamp"))
        if same_status(previous, status):
            return status
        self.observe_job(self.kube.merge_patch(API_VERSION, KIND, namespace, name, {"status": status}, status=True))
        phase = status["phase"]
        failed_now = phase_changed(previous, status) and phase == "Failed"
        if phase_changed(previous, status):
            reason, message = phase, status.get("message") or phase
            ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
            if failed_now and ready.get("reason") == out_of_memory.OUT_OF_MEMORY:  # the record's one line
                reason, message = out_of_memory.OUT_OF_MEMORY, out_of_memory.line(status.get("outOfMemory"))
            elif failed_now and ready.get("reason") in stuck.REASONS:  # why it could not start, and what to change
                reason = ready["reason"]
            self._event(body, reason, message, warning=failed_now)
        waiting = stuck.waiting_event(previous, status)  # why a launching job waits: a Ray pod's own words
        if waiting is not None:
            self._event(body, *waiting, warning=False)
        # A refusal or an API error: one Warning per cause and generation (a new failure has its own above).
        if new_warning(previous, status) and not failed_now:
            stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
            self._event(body, stalled["reason"], stalled["message"], warning=True)
        return status

    def _event(self, body: dict[str, Any], reason: str, message: str, *, warning: bool) -> None:
        """A Kubernetes event on the job: a phase transition, a refusal, an API error (conditions stay)."""
        meta = body["metadata"]
        now = rfc3339(datetime.now(timezone.utc))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(event)
        except Exception as exc:  # an event is a courtesy: the status was written already
            log.warning("could not post event %s for %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


def _may_have_progress(rayjob: dict[str, Any] | None, launched_before: bool) -> bool:
    """Whether the runtime may have published progress: its RayJob got past launching, or is gone after launch.

    A queued, suspended or initializing RayJob has no driver yet, so its progress ConfigMap is not read."""
    if rayjob is None:
        return launched_before
    status = rayjob.get("status") or {}
    return bool(status.get("jobStatus")) or status.get("jobDeploymentStatus") in ("Running", "Complete", "Failed")


def parse_meta(body: dict[str, Any]):
    """The live object's metadata as the API model."""
    from forge_replay.api import ObjectMeta

    return ObjectMeta.model_validate(body["metadata"])


def _status_model(previous: dict[str, Any]) -> ForgeReplayJobStatus | None:
    if not previous:
        return None
    try:
        return ForgeReplayJobStatus.model_validate(previous)
    except ValidationError:
        return None  # a status written by hand: recomputed from the children
