"""What the pods of a job say while it waits to run, and when waiting is over: the failures that cannot fix
themselves end the job (issue 33).

Pure functions over pod and RayJob dicts as the API server returns them, with ``now`` passed in; the reconcile
function lists the pods and applies the teardown (``teardown``). Each failure has a reason of its own, the
``Ready`` / ``Stalled`` reason of the Failed job, with a message naming the pod and what to change:

- ``ImagePullFailed``: a container (or init container) of a Ray pod waiting with the kubelet's reason
  ``ErrImagePull`` or ``ImagePullBackOff`` (k8s.io/kubernetes pkg/kubelet/images/types.go ``ErrImagePull``,
  ``ErrImagePullBackOff``; also ``InvalidImageName``, ``ErrImageNeverPull``) while the pod has been on its node
  (``status.startTime``, "acknowledged by the Kubelet ... before the Kubelet pulled the container image(s)",
  k8s.io/api core/v1 types.go PodStatus.StartTime) for longer than ``Bounds.image_pull_seconds``.
- ``InitContainerFailed``: an init container of a Ray pod terminated with an exit code other than 0, in ``state`` or,
  once the kubelet restarts it (kubectl's ``Init:Error``, ``Init:CrashLoopBackOff``), in ``lastState``
  (core/v1 ContainerStateTerminated.ExitCode; PodStatus.InitContainerStatuses). An init container does the same
  work each time: it never fixes itself.
- ``CrashLoop``: a Ray container waiting with reason ``CrashLoopBackOff`` (pkg/kubelet/container/sync_result.go
  ``ErrCrashLoopBackOff``) after ``Bounds.crash_loop_restarts`` restarts or more (ContainerStatus.RestartCount).
- ``StartDeadlineExceeded``: ``spec.scheduling.startDeadlineSeconds`` passed from the job's admission (Kueue
  un-suspended its RayJob: ``status.admissionTime``), or from its creation without a queue, and it does not run yet
  (unschedulable pods included: their PodScheduled=False message is in the status message).

A job that failed for one of these stays failed for it (its pods go away after). Its Ray cluster is deleted at once
(``teardown``): the out-of-memory teardown sets the RayJob's ``ttlSecondsAfterFinished`` to 0, which frees the cluster
only once the Ray job has ended; a Ray job that never started is ended by ``activeDeadlineSeconds: 1`` (kuberay v1.5.0
rayjob_controller.go ``checkActiveDeadlineAndUpdateStatusIfNeeded``, checked while Initializing and Running: Failed
with reason DeadlineExceeded, never retried), then KubeRay deletes the cluster. Both are patches of the RayJob the
operator already holds the verb for; Kueue sees the RayJob finished and gives its quota back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from forge_replay.controller import naming, out_of_memory

IMAGE_PULL_FAILED = "ImagePullFailed"
INIT_CONTAINER_FAILED = "InitContainerFailed"
CRASH_LOOP = "CrashLoop"
START_DEADLINE_EXCEEDED = "StartDeadlineExceeded"
REASONS = (IMAGE_PULL_FAILED, INIT_CONTAINER_FAILED, CRASH_LOOP, START_DEADLINE_EXCEEDED)
"""The Ready / Stalled reasons of a job ended because it could not start (docs/operator.md lists each)."""

PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
WAITING_PHASES = ("Pending", "Verifying", "Launching")
"""The phases of a job that does not run yet (the start deadline's clock runs in them)."""

END_AT_ONCE = {"activeDeadlineSeconds": 1, "ttlSecondsAfterFinished": 0}
"""The RayJob spec fields that make KubeRay end a Ray job that never started and delete its cluster at once."""


@dataclass(frozen=True)
class Bounds:
    """How long the operator lets a Ray pod fail before it ends the job (the operator's settings)."""

    image_pull_seconds: int = 300
    crash_loop_restarts: int = 3


@dataclass(frozen=True)
class Stopped:
    """Why a job that could not start ends: its reason, the status message, and ClusterReady's message."""

    reason: str
    message: str
    cluster: str


def _stop(reason: str, what: str, hint: str) -> Stopped:
    """A Stopped whose message says what happened, then what to do; ClusterReady says what happened."""
    return Stopped(reason, f"{what.rstrip('.')}. What to do: {hint}", what)


def verify_pod_note(pods: list[dict[str, Any]], *, failed: bool) -> str | None:
    """What pods say: the termination message once failed, else why a pod is stuck (if one is).

    Used for the verify Job's pod and, while a RayJob launches, for its Ray pods (``launch_note``)."""
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            terminated = state.get("terminated") or {}
            if failed and terminated.get("message"):
                return terminated["message"]
            if failed and terminated:
                return f"exit code {terminated.get('exitCode')} ({terminated.get('reason') or 'Error'}), no output"
            waiting = state.get("waiting") or {}
            if not failed and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                return f"pod {name}: {waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
        if not failed:
            for cond in status.get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    return f"pod {name} cannot be scheduled: {cond.get('message') or cond.get('reason')}"
    return None


def pod_failure(pods: list[dict[str, Any]], now: datetime, bounds: Bounds) -> Stopped | None:
    """The first Ray pod (oldest first) failing in a way that cannot fix itself, past its bound; None otherwise."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""):
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name") or "?"
        found = (_init_failed(name, status.get("initContainerStatuses") or [])
                 or _pull_failed(name, pod, now, bounds) or _crash_loop(name, status, bounds))
        if found is not None:
            return found
    return None


def _init_failed(pod: str, statuses: list[dict[str, Any]]) -> Stopped | None:
    for container in statuses:
        for state in ("state", "lastState"):
            terminated = (container.get(state) or {}).get("terminated") or {}
            if terminated and terminated.get("exitCode") not in (0, None):
                said = (terminated.get("message") or "").strip()
                what = (f"init container {container.get('name')} of pod {pod} failed: exit code "
                        f"{terminated.get('exitCode')} ({terminated.get('reason') or 'Error'})"
                        + (f": {said}" if said else ""))
                return _stop(INIT_CONTAINER_FAILED, what, f"read its log (kubectl logs {pod} -c "
                               f"{container.get('name')}); with slime / miles the team's image (spec.trainer.image) "
                               "needs a shell, Python 3 and Ray: fix the image, then delete and re-create the "
                               "ForgeReplayJob")
    return None


def _pull_failed(pod: str, body: dict[str, Any], now: datetime, bounds: Bounds) -> Stopped | None:
    status = body.get("status") or {}
    since = _parse_time(status.get("startTime") or (body.get("metadata") or {}).get("creationTimestamp"))
    if since is None or now - since < timedelta(seconds=bounds.image_pull_seconds):
        return None
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_REASONS:
            seconds = int((now - since).total_seconds())
            what = (f"pod {pod} could not pull image {container.get('image') or '?'} for container "
                    f"{container.get('name')} in {seconds} s ({waiting['reason']}: "
                    f"{(waiting.get('message') or '').strip() or 'no message'})")
            return _stop(IMAGE_PULL_FAILED, what, "fix spec.image (or spec.trainer.image with "
                           "slime / miles, the operator's --runtime-image when both are empty) or give the pods a "
                           "pull secret (spec.pod.imagePullSecrets), then delete and re-create the ForgeReplayJob")
    return None


def _crash_loop(pod: str, status: dict[str, Any], bounds: Bounds) -> Stopped | None:
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        restarts = int(container.get("restartCount") or 0)
        if waiting.get("reason") != CRASH_LOOP_BACK_OFF or restarts < bounds.crash_loop_restarts:
            continue
        last = (container.get("lastState") or {}).get("terminated") or {}
        said = (last.get("message") or "").strip()
        what = (f"container {container.get('name')} of pod {pod} is in CrashLoopBackOff after {restarts} restarts "
                f"(last exit code {last.get('exitCode', '?')}, {last.get('reason') or 'Error'}"
                + (f": {said}" if said else "") + ")")
        name = container.get("name")
        return _stop(CRASH_LOOP, what, f"read why it exits (kubectl logs {pod} -c {name} "
                       "--previous); a team image (spec.trainer.image) must start Ray (ray start); a container "
                       "OOMKilled needs more memory; then delete and re-create the ForgeReplayJob")
    return None


def start_deadline(job: Any, previous: dict[str, Any], phase: str, now: datetime,
                   note: str | None = None) -> Stopped | None:
    """StartDeadlineExceeded when ``spec.scheduling.startDeadlineSeconds`` passed from the job's admission (with a
    Kueue queue: ``status.admissionTime``) or its creation (without one) while it is still waiting in ``phase``.
    ``note`` is why a Ray pod does not start (``verify_pod_note``): unschedulable, pulling, ..."""
    limit = job.spec.scheduling.start_deadline_seconds
    if limit is None or phase not in WAITING_PHASES:
        return None
    queued = bool(job.spec.scheduling.queue_name)
    if queued and phase == "Pending":  # in the Kueue queue (again, if preempted): the next admission starts the clock
        return None
    since_text = previous.get("admissionTime") if queued else (job.metadata.model_extra or {}).get(
        "creationTimestamp")
    since = _parse_time(since_text)
    if since is None or now - since < timedelta(seconds=limit):
        return None
    origin = "its admission by Kueue" if queued else "its creation"
    what = (f"the job did not start running within spec.scheduling.startDeadlineSeconds ({limit} s) of {origin} at "
            f"{since_text}; it is {phase}" + (f": {note}" if note else ""))
    return _stop(START_DEADLINE_EXCEEDED, what, f"see why it waits (kubectl describe pods -l {naming.LABEL_JOB}="
                 f"{job.metadata.name}); ask for what the pool has free (spec.trainer.gpusPerNode, spec.rollout.numGpus, "
                 "spec.scheduling.nodeSelector / tolerations) or raise startDeadlineSeconds, then delete and re-create "
                 "the ForgeReplayJob")


def ended(previous: dict[str, Any]) -> bool:
    """Whether the status ``previous`` is of a job that ended because it could not start (nothing is created for
    it any more)."""
    ready = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {})
    return previous.get("phase") == "Failed" and ready.get("reason") in REASONS


def stopped(job: Any, previous: dict[str, Any], phase: str, pods: list[dict[str, Any]] | None, now: datetime,
            bounds: Bounds | None = None, note: str | None = None) -> Stopped | None:
    """Why a job waiting in ``phase`` ends now (a Ray pod failing past its bound, then the start deadline), or why
    it already ended so (kept once written: its RayJob and pods are deleted right after). None otherwise."""
    if ended(previous):
        ready = next(c for c in previous["conditions"] if c.get("type") == "Ready")
        cluster = next((c for c in previous.get("conditions") or [] if c.get("type") == "ClusterReady"), {})
        return Stopped(ready["reason"], ready.get("message") or "", cluster.get("message") or "")
    if phase not in WAITING_PHASES:
        return None
    return pod_failure(pods or [], now, bounds or Bounds()) or start_deadline(job, previous, phase, now, note)


def admission_time(job: Any, previous: dict[str, Any], rayjob: dict[str, Any] | None, phase: str,
                   now_text: str) -> str | None:
    """``status.admissionTime``: when the job was let start. With a Kueue queue, when the operator first saw its
    RayJob un-suspended (Kueue admitted it), cleared while it waits in the queue again (Kueue preempted it: the next
    admission counts); without one, when its RayJob was created."""
    kept = previous.get("admissionTime")
    if rayjob is None or phase in ("Succeeded", "Failed"):
        return kept
    if not job.spec.scheduling.queue_name:
        return kept or (rayjob.get("metadata") or {}).get("creationTimestamp") or now_text
    if (rayjob.get("spec") or {}).get("suspend") or phase in ("Pending", "Suspended"):
        return None
    return kept or now_text


def first_step_time(previous: dict[str, Any], progress: Any, now_text: str) -> str | None:
    """``status.firstStepTime``: when the runtime first reported a rollout trained (its report's time, else when the
    operator read it). Kept once set."""
    if previous.get("firstStepTime") or progress is None or progress.completed < 1:
        return previous.get("firstStepTime")
    return progress.updated_at or now_text


def teardown(status: dict[str, Any], rayjob: dict[str, Any] | None) -> dict[str, Any] | None:
    """The RayJob spec patch that frees a finished job's Ray cluster at once: ``END_AT_ONCE`` for a job that could
    not start, ``ttlSecondsAfterFinished: 0`` for one that ran out of memory (KubeRay deletes the cluster as soon
    as the Ray job has ended); only what the RayJob does not say yet, None when nothing is to change."""
    if rayjob is None or (rayjob.get("metadata") or {}).get("deletionTimestamp"):
        return None
    spec = rayjob.get("spec") or {}
    if ended(status):
        patch = {key: value for key, value in END_AT_ONCE.items() if spec.get(key) != value}
        return patch or None
    return {"ttlSecondsAfterFinished": 0} if out_of_memory.needs_teardown(status, rayjob) else None


def waiting_event(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[str, str] | None:
    """The (reason, message) of a Normal event when a launching job starts waiting on a Ray pod (ClusterReady turns
    ``PodsNotReady``, with the pod's own reason: unschedulable, pulling, crash-looping), or waits on it for another
    reason than before; None otherwise (one event per cause, not one per resync)."""
    def note(status: dict[str, Any] | None) -> str | None:
        cond = next((c for c in (status or {}).get("conditions") or [] if c.get("type") == "ClusterReady"), {})
        if cond.get("reason") != "PodsNotReady":
            return None
        return (cond.get("message") or "").split("; ", 1)[-1]  # the pod's note, after the cluster's own words

    now_note = note(new)
    if now_note is None or _cause(now_note) == _cause(note(old)):
        return None
    return "PodsNotReady", now_note


def _cause(note: str | None) -> str | None:
    """A pod note without its changing details: ``pod X: Reason`` (ErrImagePull and ImagePullBackOff alternate as the
    kubelet backs off: one cause)."""
    if note is None:
        return None
    head = note.split(": ", 2)
    cause = ": ".join(head[:2])
    return cause.replace("ErrImagePull", "ImagePullBackOff")


def _parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None
