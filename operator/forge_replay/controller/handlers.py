"""kopf handlers: thin wiring from Kubernetes events to ``Reconciler.reconcile``.

- ForgeReplayJob created / changed / found at startup -> reconcile it (kopf keeps its progress in
  ``forgereplay.io/*`` annotations, never in status).
- A labelled child (RayJob, verify Job, ConfigMap) changed -> reconcile its owner.
- A periodic resync thread reconciles unfinished jobs, in case an event was missed.
- No delete handler and no timer or daemon: kopf adds no finalizer, so deleting a job never hangs
  while the operator is down; children go with the job through owner references.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import kopf

from forge_replay.api import GROUP, PLURAL, VERSION
from forge_replay.controller import naming
from forge_replay.controller.kube import KubeError
from forge_replay.controller.reconcile import ReconcileConflict, Reconciler
from forge_replay.controller.status import PERMANENT_API_ERRORS, TERMINAL_PHASES

log = logging.getLogger("forge_replay.controller")

CHILD_LABELS = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_JOB: kopf.PRESENT}
CHILD_SELECTOR = f"{naming.LABEL_MANAGED_BY}={naming.MANAGED_BY},{naming.LABEL_JOB}"
"""The same filter, server-side: kopf's ``labels=`` filters in the client, after the API sent everything."""
CHILD_RESOURCES = (("ray.io", "v1", "rayjobs"), ("batch", "v1", "jobs"), ("v1", "configmaps"))
"""Every child kind the operator watches (one kopf.on.event handler each below)."""


def _reconciler(memo: Any) -> Reconciler:
    return memo["reconciler"]


def _run(memo: Any, namespace: str, name: str, trigger: str) -> None:
    try:
        _reconciler(memo).reconcile(namespace, name, trigger)
    except ReconcileConflict as exc:
        raise kopf.TemporaryError(str(exc), delay=30) from exc
    except KubeError as exc:
        if exc.status in PERMANENT_API_ERRORS:  # Stalled=True is in the status; the resync retries slowly
            raise kopf.PermanentError(str(exc)) from exc
        if exc.status in (409, 429) or exc.status >= 500:
            raise kopf.TemporaryError(str(exc), delay=5) from exc
        raise


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Production settings: own prefix, progress in annotations, watch timeouts, quiet event posting."""
    ours = memo["settings"]
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.PREFIX, key="last-handled-configuration"
    )
    settings.watching.server_timeout = ours.watch_server_timeout
    settings.watching.client_timeout = ours.watch_client_timeout
    settings.watching.connect_timeout = ours.connect_timeout
    for resource in CHILD_RESOURCES:  # list and watch only our children, not every ConfigMap and Job
        settings.watching.label_selectors[resource] = CHILD_SELECTOR
    settings.networking.request_timeout = 60
    settings.posting.level = logging.WARNING  # phase transitions are posted as events by the reconciler
    settings.execution.max_workers = ours.max_workers
    _start_resync(memo)


@kopf.on.cleanup()
def stop(memo: Any, **_: Any) -> None:
    """Stop the resync thread, and raise kopf's stop flag so that the thread waiting on it ends (see run_operator)."""
    for flag in ("resync_stop", "stop_flag"):
        if memo.get(flag) is not None:
            memo[flag].set()


@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
def on_create(namespace: str, name: str, memo: Any, **_: Any) -> None:
    """A new ForgeReplayJob."""
    _run(memo, namespace, name, "create")


@kopf.on.update(GROUP, VERSION, PLURAL, backoff=5)
def on_update(namespace: str, name: str, memo: Any, **_: Any) -> None:
    """Spec or metadata changed (status changes do not trigger this)."""
    _run(memo, namespace, name, "update")


@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
def on_resume(namespace: str, name: str, memo: Any, **_: Any) -> None:
    """The operator (re)started and found this job."""
    _run(memo, namespace, name, "resume")


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_job_event(event: dict[str, Any], namespace: str, name: str, memo: Any, **_: Any) -> None:
    """Keep the newest copy of each job (child-event reconciles work from it); forget deleted jobs (metrics,
    locks); everything else goes through the handlers above."""
    if event.get("type") == "DELETED":
        _reconciler(memo).forget(namespace, name)
    elif event.get("object"):
        _reconciler(memo).observe_job(dict(event["object"]))


RAYJOB_STATUS_READ = ("jobDeploymentStatus", "jobStatus", "reason", "message", "rayClusterName", "startTime",
                      "endTime")
"""The RayJob status fields status_from reads (plus rayClusterStatus.state): KubeRay's other updates are skipped."""


def _fingerprint(body: Any) -> str:
    """What of a child matters to its owner's status (not resourceVersion, KubeRay's bookkeeping etc.)."""
    status = body.get("status") or {}
    if body.get("kind") == "RayJob":
        status = {k: status.get(k) for k in RAYJOB_STATUS_READ} | {
            "clusterState": (status.get("rayClusterStatus") or {}).get("state")}
    relevant = {"status": status, "suspend": (body.get("spec") or {}).get("suspend"), "data": body.get("data")}
    return json.dumps(relevant, sort_keys=True, default=str)


def _child_event(event: dict[str, Any], body: Any, namespace: str, memo: Any, trigger: str) -> None:
    owner = (body.get("metadata", {}).get("labels") or {}).get(naming.LABEL_JOB)
    if not owner:
        return
    # Skip events that change nothing the owner's status depends on (metadata-only updates by KubeRay etc.).
    seen = memo.setdefault("child_fingerprints", {})
    key = (trigger, namespace, body.get("metadata", {}).get("name"))
    if event.get("type") == "DELETED":
        seen.pop(key, None)
    else:
        fingerprint = _fingerprint(body)
        if seen.get(key) == fingerprint:
            return
        seen[key] = fingerprint
    # The RayJob as delivered saves reading it again (a deleted one is read: it may be gone or re-created).
    rayjob = dict(body) if trigger == "rayjob" and event.get("type") != "DELETED" else None
    try:
        _reconciler(memo).reconcile(namespace, owner, trigger, rayjob=rayjob)
    except (ReconcileConflict, KubeError) as exc:
        log.warning("reconcile of %s/%s after a %s event failed (retried by resync): %s", namespace, owner, trigger, exc)


@kopf.on.event("ray.io", "v1", "rayjobs", labels=CHILD_LABELS)
def on_rayjob_event(event: dict[str, Any], body: Any, namespace: str, memo: Any, **_: Any) -> None:
    """The RayJob changed: refresh the owner's status (phase, cluster, times)."""
    _child_event(event, body, namespace, memo, "rayjob")


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
def on_verify_event(event: dict[str, Any], body: Any, namespace: str, memo: Any, **_: Any) -> None:
    """The verify Job changed: on success the RayJob is created, on failure the job fails."""
    _child_event(event, body, namespace, memo, "verify")


@kopf.on.event("v1", "configmaps", labels=CHILD_LABELS)
def on_configmap_event(event: dict[str, Any], body: Any, namespace: str, memo: Any, **_: Any) -> None:
    """The runtime published progress: copy it into the owner's status."""
    if body.get("metadata", {}).get("name", "").endswith("-progress") and (body.get("data") or {}):
        _child_event(event, body, namespace, memo, "progress")


def _start_resync(memo: Any) -> None:
    interval = memo["settings"].resync_seconds
    if not interval:
        return
    stopper = threading.Event()
    memo["resync_stop"] = stopper

    def loop() -> None:
        reconciler = _reconciler(memo)
        while not stopper.wait(interval):
            try:
                jobs = reconciler.list_jobs(memo["settings"].namespaces)
            except Exception as exc:  # e.g. the CRD is not installed yet; the next round retries
                log.warning("resync could not list ForgeReplayJobs: %s", exc)
                continue
            for namespace, name, phase in jobs:
                if phase in TERMINAL_PHASES:
                    continue
                try:
                    reconciler.reconcile(namespace, name, "resync")
                except Exception as exc:  # logged and counted; the next round retries
                    log.warning("resync of %s/%s failed: %s", namespace, name, exc)

    threading.Thread(target=loop, name="forge-replay-resync", daemon=True).start()
